#!/usr/bin/env bash
# Here, no GPU needed: the registers and spill bytes ptxas gives every fused decode kernel (dec_k in
# src/backend/cuda/kernels/decode.cu, sm_90), a line per instantiation named by its template
# arguments (op, kU, weight format, pipelined, 8-bit activations). With REV, the same for REV's
# sources and only the instantiations that differ, so a kernel change can say "same registers, no
# new spills" before it reaches a GPU. Each compile takes 1-2 minutes on 2 cores.
# Needs a configured build tree (BUILD_DIR, default build; tools/bootstrap.sh makes one).
# usage: tools/gpu/ptxas_regs.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bd=${BUILD_DIR:-build}
obj=CMakeFiles/ss_cuda_kernels.dir/src/backend/cuda/kernels/decode.cu.o
cmd=$(ninja -C "$bd" -t commands "$obj" | tail -1)
[ -n "$cmd" ] || { echo "ptxas_regs: no compile command for $obj in $bd" >&2; exit 1; }
# The compile command without its dependency file, writing a scratch object, with ptxas's report.
cmd=$(echo "$cmd" | sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+\.o( |$)/ -o OBJ -Xptxas -v\1/')
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
report() {  # report SRC_ROOT OUT: ptxas's lines for the tree at SRC_ROOT
  local c=${cmd//$root\/src/$1/src}
  c=${c//OBJ/$scratch/dec.o}
  (cd "$root/$bd" && eval "$c") > "$2" 2>&1 || { tail -20 "$2" >&2; exit 1; }
}
report "$root" "$scratch/new.txt"
if [ $# -ge 1 ]; then
  mkdir -p "$scratch/base"
  git archive "$1" src | tar -x -C "$scratch/base"
  report "$scratch/base" "$scratch/base.txt"
fi
python3 - "$scratch/new.txt" ${1:+"$scratch/base.txt"} <<'EOF'
import re, sys
OPS = ["qkv", "add", "gate_up", "logits"]
FMTS = ["bf16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "q5_0", "q5_1", "q5_k"]
# dec_k<Op, kU, WFormat, kPipe, kI8[, a sixth bool some revisions had (kOcc3: "occ3")]>
NAME = re.compile(r"dec_kILNS\d_3dec2OpE(\d)ELi(\d)ELNS\d_7WFormatE(\d+)ELb([01])ELb([01])(?:ELb([01]))?E")
def parse(path):
    cur, out = None, {}
    for line in open(path):
        if "Compiling entry function" in line or "Function properties for" in line:
            n = NAME.search(line)
            cur = None if not n else "%-8s kU %s %-5s%s%s%s" % (OPS[int(n[1])], n[2], FMTS[int(n[3])],
                                                              " pipe" if n[4] == "1" else "", " i8" if n[5] == "1" else "",
                                                              " occ3" if n[6] == "1" else "")
            continue
        if cur is None:
            continue
        r = re.search(r"Used (\d+) registers", line)
        s = re.search(r"(\d+) bytes spill stores", line)
        reg, sp = out.get(cur, (None, 0))
        out[cur] = (int(r[1]) if r else reg, int(s[1]) if s else sp)
    return out
new = parse(sys.argv[1])
if len(sys.argv) == 2:
    for k in sorted(new):
        print("%-32s %3d registers, %4d bytes spilled" % (k, *new[k]))
    sys.exit(0)
base = parse(sys.argv[2])
diff = [k for k in sorted(set(new) | set(base)) if new.get(k) != base.get(k)]
for k in diff:
    print("%-32s base %-12s now %s" % (k, "%s r, %s sp" % base[k] if k in base else "-", "%s r, %s sp" % new[k] if k in new else "-"))
print("%d of %d instantiations differ" % (len(diff), len(set(new) | set(base))))
EOF
