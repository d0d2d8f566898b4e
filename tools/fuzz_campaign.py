#!/usr/bin/python3
"""fuzz_campaign.py - run Kiln's libFuzzer targets for a set time each and keep a ledger.

For each chosen target (build-fuzz/fuzz/fuzz_<name>, built by `make fuzz`) this
copies the checked-in corpus tests/corpus/<dir>/ to a scratch folder, runs the
fuzzer on it at `nice -n 19` for --seconds (libFuzzer's -max_total_time, with
-rss_limit_mb, -timeout and -print_final_stats=1; crash, timeout and
out-of-memory inputs go to an artifact folder of the run), reads libFuzzer's
output (executions, coverage at the start and at the end, corpus size, the
finding and its artifact) and the child's CPU time (wait4's rusage), and
appends one tab-separated line per run to the ledger (docs/fuzz-ledger.tsv):

  date target corpus seconds wall_s cpu_s execs exec_per_s cov_start cov_end
  ft_end corpus_start corpus_end new_units merged finding artifact revision

(finding: "none", "stopped" (SIGINT: not a finding), or crash / timeout / oom / leak / ubsan / exit, with the
sanitizer's one-line summary in the log; artifact: the input's path, under the
run's work folder, or "-"). Then it prints every target's cumulative CPU time
from the whole ledger, which is what docs/RELIABILITY.md reports (issue 21 asks
for one CPU-hour per target in total).

With --merge, inputs of the run that add coverage to the checked-in corpus
(libFuzzer's -merge=1 against a copy of it) are copied into tests/corpus/<dir>/,
smallest first, at most --merge-max-files files and --merge-max-bytes bytes per
target and none over --merge-max-file-bytes, so that the repository stays small
(the replay tests run every file of a corpus on every build).

Findings stop that target's run (libFuzzer stops at the first); the campaign
goes on with the next target and exits 1 at the end if there was any. A reused
--work folder keeps a previous run's finding (renamed <target>-finding-<time>).

Do not pause a running fuzzer with SIGSTOP: libFuzzer's -timeout is wall-clock
time, so the input it was running when stopped is reported as a timeout when it
continues. Stop it with SIGINT instead (recorded as "stopped", not a finding).

usage: tools/fuzz_campaign.py [--seconds N] [--targets a,b,...] [--merge] [--report]
  e.g. tools/fuzz_campaign.py --seconds 3600                 # every target, an hour each
       tools/fuzz_campaign.py --seconds 600 --targets npy,grpc_frames --merge
       tools/fuzz_campaign.py --report                       # the ledger's totals only
"""
import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ["date", "target", "corpus", "seconds", "wall_s", "cpu_s", "execs", "exec_per_s",
          "cov_start", "cov_end", "ft_end", "corpus_start", "corpus_end", "new_units", "merged",
          "finding", "artifact", "revision"]
# targets whose corpus folder is not their own name
CORPUS_OF = {"onnx_load": "onnx", "json_request": "json"}

STATUS_RE = re.compile(r"^#(\d+)\s+(INITED|NEW|REDUCE|pulse|DONE|RELOAD)\b.*?cov: (\d+) ft: (\d+)"
                       r"(?: corp: (\d+)/)?")
STAT_RE = re.compile(r"^stat::(\w+):\s+(\d+)")
ARTIFACT_RE = re.compile(r"Test unit written to (\S+)")
FINDINGS = [  # (pattern in the output, kind), first match wins
    (re.compile(r"ERROR: libFuzzer: timeout"), "timeout"),
    (re.compile(r"ERROR: libFuzzer: out-of-memory"), "oom"),
    (re.compile(r"ERROR: LeakSanitizer"), "leak"),
    (re.compile(r"ERROR: libFuzzer: fuzz target exited"), "exit"),
    (re.compile(r"runtime error:|UndefinedBehaviorSanitizer"), "ubsan"),
    (re.compile(r"ERROR: AddressSanitizer|ERROR: libFuzzer: deadly signal|"
                r"ERROR: libFuzzer: (?:crash|malloc|out-of-memory \(malloc)"), "crash"),
]


def corpus_dir(name):
    return CORPUS_OF.get(name, name)


def revision():
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        rev = r.stdout.strip() or "-"
        d = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no",
                            "--", "src", "fuzz", "include"], capture_output=True, text=True, timeout=10)
        return rev + ("+dirty" if d.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "-"


def parse_output(text):
    """Figures from libFuzzer's output: a dict with the ledger's fields it can fill."""
    out = {"execs": 0, "exec_per_s": 0, "cov_start": "", "cov_end": "", "ft_end": "",
           "corpus_start": "", "corpus_end": "", "new_units": 0, "finding": "none", "artifact": "-",
           "summary": ""}
    last = None
    for line in text.splitlines():
        m = STATUS_RE.match(line)
        if m:
            n, kind, cov, ft, corp = m.groups()
            if kind == "INITED" and out["cov_start"] == "":
                out["cov_start"], out["corpus_start"] = int(cov), int(corp or 0)
            last = (int(n), int(cov), int(ft), corp)
            continue
        m = STAT_RE.match(line)
        if m:
            key, val = m.group(1), int(m.group(2))
            if key == "number_of_executed_units":
                out["execs"] = val
            elif key == "average_exec_per_sec":
                out["exec_per_s"] = val
            elif key == "new_units_added":
                out["new_units"] = val
            continue
        m = ARTIFACT_RE.search(line)
        if m and out["artifact"] == "-":
            out["artifact"] = m.group(1)
        if line.startswith("SUMMARY:") and not out["summary"]:
            out["summary"] = line.strip()
    if last:
        out["cov_end"], out["ft_end"] = last[1], last[2]
        if last[3] is not None:
            out["corpus_end"] = int(last[3])
        if not out["execs"]:
            out["execs"] = last[0]
    for pat, kind in FINDINGS:
        if pat.search(text):
            out["finding"] = kind
            break
    return out


def lower_autogroup(pid):
    """nice alone does not yield to the rest of the machine where the kernel groups tasks by
    session (sched_autogroup, Debian's default): the new session would compete as an equal
    with the user's shell. Lowers the session's group weight too, where the kernel allows."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write("19")
    except OSError:
        pass


def run_fuzzer(binary, corpus, artifacts, args, log_path):
    """Runs one fuzzer at nice 19; (exit status, wall seconds, CPU seconds of the child)."""
    cmd = ["nice", "-n", "19", str(binary), f"-max_total_time={args.seconds}",
           f"-rss_limit_mb={args.rss_limit_mb}", f"-timeout={args.timeout}", "-print_final_stats=1",
           f"-artifact_prefix={artifacts}/", *args.extra, str(corpus)]
    env = dict(os.environ)
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    env.setdefault("ASAN_OPTIONS", "abort_on_error=0")
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        lower_autogroup(p.pid)
        # libFuzzer stops itself at max_total_time; this only guards against a wedged run
        guard = threading.Timer(args.seconds * 1.5 + 120,
                                lambda: os.killpg(p.pid, signal.SIGKILL))
        guard.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            guard.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, time.time() - t0, ru.ru_utime + ru.ru_stime


def merge_back(binary, name, scratch, work, args):
    """Merges the run's inputs that add coverage into tests/corpus/<dir>/, within the caps;
    how many files were added."""
    repo = ROOT / "tests" / "corpus" / corpus_dir(name)
    repo.mkdir(parents=True, exist_ok=True)
    into = work / "merge"
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(repo, into)
    before = {p.name for p in into.iterdir()}
    cmd = ["nice", "-n", "19", str(binary), "-merge=1", f"-rss_limit_mb={args.rss_limit_mb}",
           f"-timeout={args.timeout}", f"-artifact_prefix={work}/merge-", str(into), str(scratch)]
    with open(work / "merge.log", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.seconds + 600)
    if r.returncode != 0:
        print(f"  merge failed (exit {r.returncode}), see {work / 'merge.log'}; nothing merged")
        return 0
    fresh = sorted((p for p in into.iterdir() if p.is_file() and p.name not in before),
                   key=lambda p: (p.stat().st_size, p.name))
    added, nbytes = 0, 0
    for p in fresh:
        size = p.stat().st_size
        if added >= args.merge_max_files or size > args.merge_max_file_bytes or \
                nbytes + size > args.merge_max_bytes:
            continue
        # tests/corpus/onnx is also test_malformed.py's corpus, where a file must be refused
        # unless its name starts with "any_": a merged input may be a model that loads
        dest = repo / (("any_" + p.name) if corpus_dir(name) == "onnx" else p.name)
        shutil.copyfile(p, dest)
        added += 1
        nbytes += size
    print(f"  merge: {len(fresh)} inputs add coverage, {added} kept ({nbytes} bytes) in {repo}")
    return added


def read_ledger(path):
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("date\t"):
            continue
        cells = line.split("\t")
        if len(cells) >= len(FIELDS):
            rows.append(dict(zip(FIELDS, cells)))
    return rows


def append_ledger(path, row):
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a") as f:
        if new:
            f.write("# tools/fuzz_campaign.py: one libFuzzer run a line (docs/RELIABILITY.md, Fuzzing)\n")
            f.write("\t".join(FIELDS) + "\n")
        f.write("\t".join(str(row.get(k, "")).replace("\t", " ") for k in FIELDS) + "\n")


def report(path, names=None, goal_h=1.0):
    rows = read_ledger(path)
    tot = {}
    for r in rows:
        t = tot.setdefault(r["target"], {"cpu": 0.0, "runs": 0, "execs": 0, "findings": 0, "cov": ""})
        try:
            t["cpu"] += float(r["cpu_s"])
            t["execs"] += int(r["execs"] or 0)
        except ValueError:
            pass
        t["runs"] += 1
        t["findings"] += r["finding"] not in ("none", "stopped")
        t["cov"] = r["cov_end"] or t["cov"]
    for n in names or []:  # targets without a run yet show as 0
        tot.setdefault(n if n.startswith("fuzz_") else "fuzz_" + n, {"cpu": 0.0, "runs": 0, "execs": 0, "findings": 0, "cov": ""})
    print(f"\ncumulative CPU time per target ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}):")
    print(f"  {'target':<20} {'runs':>4} {'cpu_h':>7} {'execs':>13} {'last cov':>8} {'findings':>8}")
    short = 0
    for n in sorted(tot):
        t = tot[n]
        done = t["cpu"] >= goal_h * 3600
        short += not done
        print(f"  {n:<20} {t['runs']:>4} {t['cpu'] / 3600:>7.2f} {t['execs']:>13,} {str(t['cov']):>8} "
              f"{t['findings']:>8}{'' if done else f'  (under {goal_h:g} h)'}")
    print(f"  {len(tot) - short} of {len(tot)} targets at {goal_h:g} CPU-hour or more")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build-fuzz"), help="the `make fuzz` build (build-fuzz)")
    ap.add_argument("--targets", default="all",
                    help="comma-separated names (npy, grpc_frames, ...; fuzz_ prefix optional) or all")
    ap.add_argument("--seconds", type=int, default=600, help="libFuzzer's -max_total_time per target")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    ap.add_argument("--timeout", type=int, default=30, help="libFuzzer's -timeout (s per input)")
    ap.add_argument("--ledger", default=str(ROOT / "docs" / "fuzz-ledger.tsv"))
    ap.add_argument("--work", help="folder for scratch corpora, logs and artifacts "
                                   "(default: BUILD/campaign/<UTC time>/)")
    ap.add_argument("--merge", action="store_true",
                    help="merge inputs that add coverage back into tests/corpus/<dir>/ (capped)")
    ap.add_argument("--merge-max-files", type=int, default=10)
    ap.add_argument("--merge-max-bytes", type=int, default=64 << 10)
    ap.add_argument("--merge-max-file-bytes", type=int, default=16 << 10)
    ap.add_argument("--no-ledger", action="store_true", help="do not write the ledger (trial runs)")
    ap.add_argument("--report", action="store_true", help="only print the ledger's totals")
    ap.add_argument("extra", nargs="*", help="more libFuzzer flags, after --")
    a = ap.parse_args()
    ledger = Path(a.ledger).resolve()
    build = Path(a.build).resolve()
    found = sorted(p.name[len("fuzz_"):] for p in (build / "fuzz").glob("fuzz_*")
                   if p.is_file() and os.access(p, os.X_OK))
    if a.report:
        report(ledger, found)
        return 0
    if not found:
        print(f"no fuzz targets in {build}/fuzz: build them first (make fuzz)", file=sys.stderr)
        return 2
    if a.targets == "all":
        names = found
    else:
        names = [t.strip().removeprefix("fuzz_") for t in a.targets.split(",") if t.strip()]
        missing = [n for n in names if n not in found]
        if missing:
            print(f"not built in {build}/fuzz: {', '.join('fuzz_' + n for n in missing)} "
                  f"(built: {', '.join(found)})", file=sys.stderr)
            return 2
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work_root = Path(a.work).resolve() if a.work else build / "campaign" / stamp
    work_root.mkdir(parents=True, exist_ok=True)
    rev = revision()
    print(f"{len(names)} targets, {a.seconds} s each at nice 19; work folder {work_root}")
    failed = []
    for name in names:
        binary = build / "fuzz" / f"fuzz_{name}"
        work = work_root / name
        scratch, artifacts = work / "corpus", work / "artifacts"
        if artifacts.is_dir() and any(artifacts.iterdir()):
            # a reused --work folder: the previous run's finding stays, beside the new run
            when = datetime.datetime.fromtimestamp(artifacts.stat().st_mtime, datetime.timezone.utc)
            kept = work_root / f"{name}-finding-{when.strftime('%Y%m%dT%H%M%SZ')}"
            work.rename(kept)
            print(f"  (the previous run's finding is kept in {kept})")
        shutil.rmtree(work, ignore_errors=True)
        artifacts.mkdir(parents=True)
        seeds = ROOT / "tests" / "corpus" / corpus_dir(name)
        if seeds.is_dir():
            shutil.copytree(seeds, scratch)
        else:
            print(f"  (no tests/corpus/{corpus_dir(name)}: starting from an empty corpus)")
            scratch.mkdir()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rc, wall, cpu = run_fuzzer(binary, scratch, artifacts, a, work / "fuzz.log")
        fig = parse_output((work / "fuzz.log").read_text(errors="replace"))
        if fig["finding"] == "none" and rc != 0:
            if "libFuzzer: run interrupted" in (work / "fuzz.log").read_text(errors="replace"):
                fig["finding"] = "stopped"  # SIGINT to the fuzzer: the operator's, not a finding
            else:
                fig["finding"] = f"exit{rc}"  # libFuzzer stopped for a reason the patterns missed
        merged = 0
        if a.merge:
            merged = merge_back(binary, name, scratch, work, a)
        row = {"date": date, "target": f"fuzz_{name}", "corpus": corpus_dir(name), "seconds": a.seconds,
               "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "revision": rev, "merged": merged,
               **{k: fig[k] for k in fig if k in FIELDS}}
        if not a.no_ledger:
            append_ledger(ledger, row)
        print(f"fuzz_{name}: {row['wall_s']} s wall, {row['cpu_s']} s CPU, {fig['execs']:,} execs "
              f"({fig['exec_per_s']}/s), cov {fig['cov_start']} -> {fig['cov_end']}, corpus "
              f"{fig['corpus_start']} -> {fig['corpus_end']}, finding: {fig['finding']}"
              + (f" {fig['artifact']} ({fig['summary']})" if fig["finding"] != "none" else ""))
        if fig["finding"] not in ("none", "stopped"):
            failed.append(name)
    report(ledger, names)
    if failed:
        print(f"\nfindings in: {', '.join(failed)} (logs and inputs under {work_root})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
