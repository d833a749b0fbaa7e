#!/usr/bin/env bash
# Here, before a device call: writes .ab-base/ (ignored; name it in the call's carry) holding REV's
# version of every file that differs between REV and the working tree, at its path. On the device,
# dec_checks.sh then builds a copy of the tree with those files put back beside the main build, and
# runs its variants named old* with that baseline binary: an A/B of two builds in one call.
# usage: tools/gpu/ab_base.sh REV
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: tools/gpu/ab_base.sh REV}
rm -rf .ab-base
mkdir -p .ab-base
git diff --name-only "$rev" -- | while read -r f; do
  if git cat-file -e "$rev:$f" 2>/dev/null; then
    mkdir -p ".ab-base/$(dirname "$f")"
    git show "$rev:$f" > ".ab-base/$f"
    echo "baseline: $f from $rev"
  fi
done
