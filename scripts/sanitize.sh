#!/usr/bin/env bash
# ASan + UBSan run of the CPU tests that read files and move bytes: clang, CUDA off, in
# ./build-asan (the tree scripts/fuzz.sh builds its fuzz targets in). The first report fails
# the run: UBSan does not recover (-fno-sanitize-recover=all) and every report, the flexh2o
# processes the CLI tests start included, is also logged to build-asan/sanitizer-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-asan
# core, loader, tokenizer, offload, policies, engine (models, the offloading engine on the CPU
# device, KV policies; it runs the kernels too), the CLI, OpenAI Batch lines and convert. Not
# kernels_cpu_test, eval, planner or gpu: no parsing or I/O of their own, and eval alone takes
# longer than all of these. Not dist_test or dp_test (MPI): Open MPI's own MPI_Init/MPI_Finalize
# leave about 120 KB in 3,350 allocations per process, in components it has already unloaded, so
# LeakSanitizer cannot suppress them by library (dist_test is clean with detect_leaks=0). The
# flexh2o binary links Open MPI but starts it only under mpirun: the CLI tests here never do.
# stage_pipeline_test runs the pipeline's stages on threads over in-process channels (no MPI).
tests=(core_test loader_test tokenizer_test offload_test policies_test engine_test cli_test openai_batch_test
       convert_test stage_pipeline_test)
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_ENABLE_CUDA=OFF \
  -DFLEXH2O_ASAN=ON -DFLEXH2O_FUZZ=ON -DFLEXH2O_BUILD_BENCH=OFF -DFLEXH2O_PYTHON=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${tests[@]}" flexh2o

logs="$PWD/$dir/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
# allocator_may_return_null: a refused huge allocation is std::bad_alloc, as without ASan.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
status=0
# Test targets not in the subset are not built: CTest lists each as TARGET_NOT_BUILT.
(cd "$dir" && ctest --output-on-failure -j "$(nproc)" --timeout 900 -E "_NOT_BUILT$") || status=$?
if compgen -G "$logs/*" >/dev/null; then
  echo "sanitize: sanitizer reports (build-asan/sanitizer-logs):"
  cat "$logs"/*
  status=1
fi
exit $status
