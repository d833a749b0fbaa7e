#!/usr/bin/env bash
# Here, no GPU needed: the SASS of the CUDA kernels whose mangled names match REGEX, from the object
# build/ compiled (default: the fused decode kernels' decode.cu.o), with an opcode count for each
# kernel and for each loop body between a backward branch's target and the branch (the hot loops:
# instructions a 16 x 32 weight chunk are a round body's count over its chunks). cuobjdump is not
# in this machine's CUDA install; the script fetches NVIDIA's from PyPI (nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm) into ~/.cache/selfserve-cuobjdump once.
# usage: tools/gpu/sass_here.sh REGEX [OBJECT]   e.g. REGEX 'dec_kILNS1_3dec2OpE2ELi8ELNS1_7WFormatE1ELb0ELb0E'
#        (gate/up, Q4_0, plain loop, bf16 activations). Full SASS in $SASS_OUT (default /tmp/sass.txt).
#        SCOREBOARDS=1 also prints every instruction with its stall count and scoreboards (which loads a
#        use waits for: the pipelined loops' waits, docs/perf/gpu.md 2026-12-07).
set -euo pipefail
cd "$(dirname "$0")/../.."
re=${1:?usage: tools/gpu/sass_here.sh REGEX [OBJECT]}
obj=${2:-${BUILD_DIR:-build}/CMakeFiles/ss_cuda_kernels.dir/src/backend/cuda/kernels/decode.cu.o}
[ -f "$obj" ] || { echo "sass_here: no object $obj (build it first)" >&2; exit 1; }
cache=$HOME/.cache/selfserve-cuobjdump
co=$(command -v cuobjdump || true)
if [ -z "$co" ]; then
  co=$(find "$cache" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  if [ -z "$co" ]; then
    mkdir -p "$cache"
    python3 -m pip download --no-deps -q -d "$cache" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$cache"/*.whl; do python3 -m zipfile -e "$w" "$cache/x"; done
    co=$(find "$cache" -name cuobjdump -type f | head -1)
    chmod +x "$(dirname "$co")"/*
  fi
  export PATH="$(dirname "$co"):$PATH"  # its nvdisasm beside it
fi
out=${SASS_OUT:-/tmp/sass.txt}
"$co" -sass "$obj" | awk -v re="$re" '/Function : /{p = ($0 ~ re)} p' > "$out"
echo "sass_here: $(grep -c 'Function : ' "$out") kernel(s) matching '$re' in $out"
python3 - "$out" <<'EOF'
import re, sys, collections
lines = open(sys.argv[1]).read().split('\n')
kern, body = None, []
ins_re = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[.\s]')
def report(name, body):
    if not name: return
    ops = collections.Counter(op for _, op, _ in body)
    print(f"\n{name}: {len(body)} instructions; " + ", ".join(f"{n} {o}" for o, n in ops.most_common(12)))
    addr = {a: i for i, (a, _, _) in enumerate(body)}
    for i, (a, op, text) in enumerate(body):  # loop bodies: a branch back to an earlier address
        m = re.search(r'BRA\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)', text)
        if op == 'BRA' and m and int(m.group(1), 16) < a and int(m.group(1), 16) in addr:
            seg = body[addr[int(m.group(1), 16)]:i + 1]
            c = collections.Counter(o for _, o, _ in seg)
            print(f"  loop 0x{int(m.group(1), 16):x}-0x{a:x}: {len(seg)} instructions, {c['HMMA'] + c['IMMA']} mma; " +
                  ", ".join(f"{n} {o}" for o, n in c.most_common(8)))
for l in lines:
    if 'Function : ' in l:
        report(kern, body)
        kern, body = l.split('Function : ')[1].strip(), []
        continue
    m = ins_re.search(l)
    if m and kern:
        body.append((int(m.group(1), 16), m.group(3), l))
report(kern, body)
EOF
# SCOREBOARDS=1: every instruction again with the dependency fields of its control word (the high 64
# bits of the 128-bit encoding cuobjdump prints under it): stall cycles, the scoreboard a variable-
# latency instruction releases when its result (W) or its operand read (R) is done, and the
# scoreboards it waits for first, e.g. "st 4 W5 wait[0,5] LDG...". Bit layout as published for
# Volta-Hopper: stall 41-44, yield 45, W 46-48, R 49-51, wait mask 52-57 (7: no scoreboard).
if [ "${SCOREBOARDS:-0}" = 1 ]; then
  python3 - "$out" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().split('\n')
lo = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* 0x[0-9a-f]+ \*/')
hi = re.compile(r'^\s+/\* (0x[0-9a-f]+) \*/\s*$')
for i, l in enumerate(lines):
    if 'Function : ' in l:
        print('\n' + l.strip())
        continue
    m = lo.search(l)
    h = hi.match(lines[i + 1]) if m and i + 1 < len(lines) else None
    if not h:
        continue
    c = int(h.group(1), 16) >> 41
    w, r, mask = (c >> 5) & 7, (c >> 8) & 7, (c >> 11) & 0x3f
    waits = ','.join(str(b) for b in range(6) if mask >> b & 1)
    print(f"{m.group(1)} st{c & 0xf:2d} {'W%d' % w if w != 7 else '  '} {'R%d' % r if r != 7 else '  '} "
          f"{('wait[' + waits + ']') if waits else '':13s} {m.group(2).strip()}")
EOF
fi
