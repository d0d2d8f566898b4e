#!/bin/sh
# check_prometheus.sh REPO - ctest's check of deploy/prometheus (docs/DASHBOARDS.md):
# the scrape config and the rules it loads (`promtool check config`), the rules
# alone (`promtool check rules`), and the rules' unit tests with synthetic series
# (`promtool test rules`: each alert fires, and stays quiet, as intended).
# prometheus-kubernetes.yml is not checked here: Debian's promtool is built
# without Kubernetes discovery; tests/python/test_dashboards.py replays its
# relabeling through file discovery instead.
# Exits 77 (ctest: skipped) when promtool is not installed.
set -eu
command -v promtool >/dev/null 2>&1 || {
  echo "SKIP: promtool is not installed (Debian's prometheus package; scripts/install-deps.sh)"
  exit 77
}
cd "$1/deploy/prometheus"
promtool check config prometheus.yml
promtool check rules kiln-rules.yml
promtool test rules tests/*.yml
