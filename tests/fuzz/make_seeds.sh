#!/usr/bin/env bash
# Regenerates the binary seeds of fuzz_submit_spec (corpus/fuzz_submit_spec/NAME.bin) from their
# text form (seeds/fuzz_submit_spec/NAME.txtpb, dispatchd.v1.SubmitRequest in protobuf text
# format) with protoc. Run it after adding or editing a .txtpb, and commit both.
#
#   tests/fuzz/make_seeds.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
src=seeds/fuzz_submit_spec
out=corpus/fuzz_submit_spec
mkdir -p "$out"
rm -f "$out"/*.bin
for seed in "$src"/*.txtpb; do
  name=$(basename "$seed" .txtpb)
  protoc -I ../../proto --encode=dispatchd.v1.SubmitRequest dispatchd/v1/job_service.proto \
    <"$seed" >"$out/$name.bin"
done
echo "make_seeds: wrote $(find "$out" -name '*.bin' | wc -l) seeds to tests/fuzz/$out"
