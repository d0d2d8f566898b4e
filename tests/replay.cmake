# Fuzz corpus replay (included from tests/CMakeLists.txt).
#
# A target that reaches the runtime's internals links kiln_core (the static
# form of libkiln); one that uses only the public API and
# include/kiln/kiln_util.h links libkiln.so (kiln), or kiln_serve.
#
# Builds the ONNX loader's fuzz target with a plain main() (fuzz/replay_main.c)
# in the normal build, with whatever compiler and sanitizers the build uses
# (configure with -DKILN_SANITIZE=ON to catch memory errors, not only
# crashes), and replays every file in tests/corpus/onnx through it: each
# must load or fail cleanly, with no crash, hang or sanitizer report.
add_executable(kiln_fuzz_replay_onnx
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c
  ${PROJECT_SOURCE_DIR}/fuzz/fuzz_onnx_load.c)
target_link_libraries(kiln_fuzz_replay_onnx PRIVATE kiln)
add_test(NAME fuzz_replay_onnx
  COMMAND kiln_fuzz_replay_onnx ${PROJECT_SOURCE_DIR}/tests/corpus/onnx)
# A hang is a failure too; a sanitizer report or a signal fails the test by
# its exit status.
set_tests_properties(fuzz_replay_onnx PROPERTIES
  TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# The text-format parser and the TensorBundle reader (libkiln internals).
foreach(target textproto tensor_bundle)
  add_executable(kiln_fuzz_replay_${target}
    ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_${target}.c)
  target_include_directories(kiln_fuzz_replay_${target} PRIVATE ${PROJECT_SOURCE_DIR}/src ${GEN_DIR})
  target_link_libraries(kiln_fuzz_replay_${target} PRIVATE kiln_core)
  add_test(NAME fuzz_replay_${target}
    COMMAND kiln_fuzz_replay_${target} ${PROJECT_SOURCE_DIR}/tests/corpus/${target})
  set_tests_properties(fuzz_replay_${target} PROPERTIES TIMEOUT 300
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endforeach()

# The server's JSON request decoder (compiled from src/serve, which is not in libkiln).
add_executable(kiln_fuzz_replay_json
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_json_request.c
  ${PROJECT_SOURCE_DIR}/src/serve/json.c ${PROJECT_SOURCE_DIR}/src/serve/codec.c)
target_include_directories(kiln_fuzz_replay_json PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(kiln_fuzz_replay_json PRIVATE kiln m)
add_test(NAME fuzz_replay_json COMMAND kiln_fuzz_replay_json ${PROJECT_SOURCE_DIR}/tests/corpus/json)
set_tests_properties(fuzz_replay_json PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# The .npy reader (src/core/npy.c, in kiln_core), the tf.Example parser of the
# TfParseExample kernel, the server's config files (src/serve/config.c) and
# its JSON -> tf.Example encoder (src/serve/example.c).
set(KILN_REPLAY_npy_SRCS)
set(KILN_REPLAY_tf_example_SRCS)
set(KILN_REPLAY_serve_config_SRCS ${PROJECT_SOURCE_DIR}/src/serve/config.c)
set(KILN_REPLAY_example_json_SRCS
  ${PROJECT_SOURCE_DIR}/src/serve/example.c ${PROJECT_SOURCE_DIR}/src/serve/json.c)
set(KILN_REPLAY_warmup_SRCS ${PROJECT_SOURCE_DIR}/src/serve/warmup.c ${PROJECT_SOURCE_DIR}/src/serve/tfrecord.c)
set(KILN_REPLAY_request_log_SRCS ${PROJECT_SOURCE_DIR}/src/serve/reqlog/fromlog.c
  ${PROJECT_SOURCE_DIR}/src/serve/tfrecord.c ${PROJECT_SOURCE_DIR}/src/serve/warmup.c
  ${PROJECT_SOURCE_DIR}/src/serve/json.c)
foreach(target npy tf_example serve_config example_json warmup request_log)
  add_executable(kiln_fuzz_replay_${target}
    ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_${target}.c
    ${KILN_REPLAY_${target}_SRCS})
  target_include_directories(kiln_fuzz_replay_${target} PRIVATE ${PROJECT_SOURCE_DIR}/src ${GEN_DIR})
  target_link_libraries(kiln_fuzz_replay_${target} PRIVATE kiln_core m)
  add_test(NAME fuzz_replay_${target}
    COMMAND kiln_fuzz_replay_${target} ${PROJECT_SOURCE_DIR}/tests/corpus/${target})
  set_tests_properties(fuzz_replay_${target} PROPERTIES TIMEOUT 300
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endforeach()

# SavedModel import (saved_model.pb bytes in a temporary folder).
add_executable(kiln_fuzz_replay_savedmodel
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_savedmodel.c)
target_link_libraries(kiln_fuzz_replay_savedmodel PRIVATE kiln)
add_test(NAME fuzz_replay_savedmodel
  COMMAND kiln_fuzz_replay_savedmodel ${PROJECT_SOURCE_DIR}/tests/corpus/savedmodel)
set_tests_properties(fuzz_replay_savedmodel PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# Signing and encryption files: kiln.sig, key files, .kenc (src/security/).
foreach(target manifest encfile watermark)
  add_executable(kiln_fuzz_replay_${target}
    ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_${target}.c
    ${SECURITY_SRCS})
  target_include_directories(kiln_fuzz_replay_${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(kiln_fuzz_replay_${target} PRIVATE kiln PkgConfig::SODIUM m)
  add_test(NAME fuzz_replay_${target}
    COMMAND kiln_fuzz_replay_${target} ${PROJECT_SOURCE_DIR}/tests/corpus/${target})
  set_tests_properties(fuzz_replay_${target} PROPERTIES TIMEOUT 300
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endforeach()
# The gRPC server's HTTP/2 transport and request decoders, the bearer token
# file, and the rollout file (the kiln_serve library).
foreach(target grpc_frames tensor_proto token_file rollout_config prom_vector)
  add_executable(kiln_fuzz_replay_${target}
    ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_${target}.c)
  target_link_libraries(kiln_fuzz_replay_${target} PRIVATE kiln_serve)
  add_test(NAME fuzz_replay_${target}
    COMMAND kiln_fuzz_replay_${target} ${PROJECT_SOURCE_DIR}/tests/corpus/${target})
  set_tests_properties(fuzz_replay_${target} PROPERTIES TIMEOUT 300
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endforeach()
# The TFLite importer (FlatBuffer reader, model reader, lowering, quantized kernels).
add_executable(kiln_fuzz_replay_tflite
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_tflite.c)
target_link_libraries(kiln_fuzz_replay_tflite PRIVATE kiln)
add_test(NAME fuzz_replay_tflite
  COMMAND kiln_fuzz_replay_tflite ${PROJECT_SOURCE_DIR}/tests/corpus/tflite)
set_tests_properties(fuzz_replay_tflite PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# Compiled artifacts (.kiln, src/import/kiln_artifact.c; seeds by tools/make_kiln_corpus.py).
add_executable(kiln_fuzz_replay_kiln_artifact
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_kiln_artifact.c)
target_link_libraries(kiln_fuzz_replay_kiln_artifact PRIVATE kiln)
add_test(NAME fuzz_replay_kiln_artifact
  COMMAND kiln_fuzz_replay_kiln_artifact ${PROJECT_SOURCE_DIR}/tests/corpus/kiln_artifact)
set_tests_properties(fuzz_replay_kiln_artifact PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# XGBoost's JSON / UBJSON model files (src/import/xgboost.c, xgb_doc.c).
add_executable(kiln_fuzz_replay_xgboost
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_xgboost.c)
target_link_libraries(kiln_fuzz_replay_xgboost PRIVATE kiln m)
add_test(NAME fuzz_replay_xgboost
  COMMAND kiln_fuzz_replay_xgboost ${PROJECT_SOURCE_DIR}/tests/corpus/xgboost)
set_tests_properties(fuzz_replay_xgboost PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# A version folder's release files: kiln_version.json, kiln_blessing.json (src/serve/gate/).
add_executable(kiln_fuzz_replay_release_files
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_release_files.c)
target_link_libraries(kiln_fuzz_replay_release_files PRIVATE kiln_serve)
add_test(NAME fuzz_replay_release_files
  COMMAND kiln_fuzz_replay_release_files ${PROJECT_SOURCE_DIR}/tests/corpus/release_files)
set_tests_properties(fuzz_replay_release_files PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# The .npz reader (src/core/npz.c over npy.c and zlib; exported by libkiln).
add_executable(kiln_fuzz_replay_npz_archive
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_npz.c)
target_include_directories(kiln_fuzz_replay_npz_archive PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(kiln_fuzz_replay_npz_archive PRIVATE kiln)
add_test(NAME fuzz_replay_npz_archive
  COMMAND kiln_fuzz_replay_npz_archive ${PROJECT_SOURCE_DIR}/tests/corpus/npz)
set_tests_properties(fuzz_replay_npz_archive PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# The rollout file's shadow blocks (src/serve/shadow/shadow.c, in kiln_serve).
add_executable(kiln_fuzz_replay_shadow_config
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_shadow_config.c)
target_include_directories(kiln_fuzz_replay_shadow_config PRIVATE ${PROJECT_SOURCE_DIR}/src ${GEN_DIR})
target_link_libraries(kiln_fuzz_replay_shadow_config PRIVATE kiln_serve kiln ${PROTOBUF_C_LIB} m)
add_test(NAME fuzz_replay_shadow_config
  COMMAND kiln_fuzz_replay_shadow_config ${PROJECT_SOURCE_DIR}/tests/corpus/shadow_config)
set_tests_properties(fuzz_replay_shadow_config PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# Reference profiles of model monitoring (src/serve/monitor/profile.c).
add_executable(kiln_fuzz_replay_monitor_profile
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_monitor_profile.c
  ${PROJECT_SOURCE_DIR}/src/serve/monitor/profile.c ${PROJECT_SOURCE_DIR}/src/serve/json.c)
target_include_directories(kiln_fuzz_replay_monitor_profile PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(kiln_fuzz_replay_monitor_profile PRIVATE kiln m)
add_test(NAME fuzz_replay_monitor_profile
  COMMAND kiln_fuzz_replay_monitor_profile ${PROJECT_SOURCE_DIR}/tests/corpus/monitor_profile)
set_tests_properties(fuzz_replay_monitor_profile PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# ONNX run-time values: TensorProto, SequenceProto and OptionalProto (fuzz/fuzz_onnx_value.c).
add_executable(kiln_fuzz_replay_onnx_value
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.c ${PROJECT_SOURCE_DIR}/fuzz/fuzz_onnx_value.c)
target_include_directories(kiln_fuzz_replay_onnx_value PRIVATE ${PROJECT_SOURCE_DIR}/src ${GEN_DIR})
target_link_libraries(kiln_fuzz_replay_onnx_value PRIVATE kiln_core)
add_test(NAME fuzz_replay_onnx_value
  COMMAND kiln_fuzz_replay_onnx_value ${PROJECT_SOURCE_DIR}/tests/corpus/onnx_value)
set_tests_properties(fuzz_replay_onnx_value PROPERTIES TIMEOUT 300
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
