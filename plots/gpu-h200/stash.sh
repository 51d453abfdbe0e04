#!/bin/bash
# One chunk call on the GPU machine: copy the carried gpu-chunks/NAME to $G/chunks (default /tmp/g/chunks, which
# stays while the machine is held) and check it against manifest.json. Prints how many chunks are there now and
# how long since the first: fewer than this chunk's number means the machine was given back and started anew
# (everything under /tmp lost): then stop, the lease cannot hold the run.
#     bash plots/gpu-h200/stash.sh part-07
set -u
name=$1
G=${G:-/tmp/g} SRC=${SRC:-gpu-chunks} MANIFEST=${MANIFEST:-plots/gpu-h200/manifest.json}
mkdir -p "$G/chunks" && cp "$SRC/$name" "$G/chunks/$name.tmp" && mv "$G/chunks/$name.tmp" "$G/chunks/$name" || exit 1
if [ ! -f "$G/first-chunk" ]; then     # the first call: what the machine is (0.2 s)
    date +%s > "$G/first-chunk"
    nvidia-smi -L 2>/dev/null; python3 --version; nproc; free -g | head -2; df -h /tmp | tail -1
fi
python3 - "$G/chunks" "$name" "$MANIFEST" "$(( $(date +%s) - $(cat "$G/first-chunk") ))" <<'EOF'
import hashlib, json, pathlib, sys
folder, name, manifest, since = pathlib.Path(sys.argv[1]), sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
want = {c["name"]: c for c in manifest["chunks"]}
data = (folder / name).read_bytes()
if len(data) != want[name]["bytes"] or hashlib.sha256(data).hexdigest() != want[name]["sha256"]:
    (folder / name).unlink()
    sys.exit(f"error: {name} arrived damaged ({len(data)} bytes); send it again")
have = sorted(p.name for p in folder.glob("part-*") if p.name in want)
number = sorted(want).index(name) + 1
print(f"{name} ok: {len(have)} of {len(want)} chunks in {folder}, {since} s since the first" +
      ("" if len(have) >= number else f"; WARNING: {number - len(have)} earlier chunks are gone (a fresh machine?)"))
EOF
