#!/usr/bin/env bash
# The README's two-machine steps, scripted on one machine: one SuperLink (TLS + SuperNode
# authentication), three hospital SuperNodes, `clinograph run` (which runs `flwr run --stream` and exits
# with the run's outcome), `clinograph audit verify`.
# Everything lives in a temporary directory; every process is stopped on exit.
#   examples/flower_deployment/run_loopback.sh [--no-dp] [--rounds N] [--keep]
# Hospitals train with patient-level DP-SGD unless --no-dp; aggregation is always masked.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APP="$HERE/app"
PY="${PYTHON:-$(command -v python3)}"
BIN="$(dirname "$PY")"
DP="--dp"; ROUNDS=2; KEEP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-dp) DP="" ;;
    --rounds) ROUNDS="$2"; shift ;;
    --keep) KEEP=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

WORK="$(mktemp -d /tmp/clinograph-loopback.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if [[ $KEEP == 0 ]]; then rm -rf "$WORK"; else echo "kept $WORK"; fi
}
trap cleanup EXIT
# A free port below the kernel's ephemeral range: a port-0 pick could be taken by another program's
# outgoing connection before the SuperLink or SuperNode binds it ("address already in use").
free_port() { "$PY" -c '
import random, socket
top = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for port in random.sample(range(20000, top), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break'; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for ((i = 0; i < limit * 2; i++)); do "$@" && return 0; sleep 0.5; done
  echo "timed out after ${limit}s waiting for $what" >&2; exit 1
}
export FLWR_HOME="$WORK/flwr" PATH="$BIN:$PATH" PYTHONPATH="$APP${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0
PORT="$(free_port)"
HOSPITALS=(h1 h2 h3)

echo "== 2. keys (CA, TLS for 127.0.0.1, node-auth, signing keys, federation.toml)"
"$PY" -m clinograph.commands.keys init --out "$WORK/keys" --federation-id loopback-demo \
  --hospital h1 --hospital h2 --hospital h3 --host 127.0.0.1 --host localhost --port "$PORT"
"$PY" -m clinograph_flower_app.prepare --out "$WORK/sites" --hospital h1 --hospital h2 --hospital h3 \
  --patients 200 --federation-id loopback-demo $DP 2>/dev/null
LINK="$WORK/keys/superlink"

echo "== 3. SuperLink on 127.0.0.1:$PORT (TLS, --enable-supernode-auth)"
setsid flower-superlink --ssl-ca-certfile "$LINK/ca.pem" --ssl-certfile "$LINK/server.pem" \
  --ssl-keyfile "$LINK/server.key" --enable-supernode-auth --host 127.0.0.1 --port "$PORT" \
  --disable-runtime-dependency-installation >"$WORK/superlink.log" 2>&1 &
PIDS+=($!); disown $!
wait_for 60 "the SuperLink" "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)))"

echo "== 4. register the hospitals' node-auth keys"
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:$PORT"
root-certificates = "$LINK/ca.pem"
TOML
for h in "${HOSPITALS[@]}"; do
  timeout 60 flwr supernode register "$WORK/keys/hospitals/$h/$h.node-auth.pub" loopback --name "$h" | tail -1
done

echo "== 5. one SuperNode per hospital (the hospital lives inside it)"
for h in "${HOSPITALS[@]}"; do
  K="$WORK/keys/hospitals/$h"
  setsid "$PY" -m clinograph.secure.transport.flower.supernode \
    --environment production \
    --superlink "127.0.0.1:$PORT" --root-certificates "$K/ca.pem" \
    --auth-supernode-private-key "$K/$h.node-auth" --port "$(free_port)" \
    --node-config "hospital='$h' data-dir='$WORK/sites/$h/data' state-dir='$WORK/sites/$h/state' key-file='$K/$h.ed25519.pem' federation-file='$K/federation.toml'" \
    >"$WORK/supernode-$h.log" 2>&1 &
  PIDS+=($!); disown $!
done

echo "== 6. clinograph run ($ROUNDS rounds, masked${DP:+, DP}): flwr run --stream, and the run's outcome as exit status"
set +e
timeout 900 "$BIN/clinograph" run "$APP" loopback --check-every 10 --events-file "$WORK/events.jsonl" --run-config \
  "server-config='$WORK/sites/server/server.toml' federation-file='$LINK/federation.toml' server-key='$LINK/server.ed25519.pem' rounds=$ROUNDS min-nodes=3 wait-timeout=90.0 hello-timeout=60.0 plan-timeout=120.0 stage-timeout=60.0 end-timeout=60.0" \
  >"$WORK/clinograph-run.log" 2>&1
STATUS=$?
set -e
tail -1 "$WORK/clinograph-run.log"
if [[ $STATUS != 0 ]]; then
  echo "clinograph run exited $STATUS; its log:" >&2; tail -40 "$WORK/clinograph-run.log" >&2; exit "$STATUS"
fi
grep -E '"round_closed"|"dropped"' "$WORK/events.jsonl"

echo "== 7. verify the audit directory"
"$PY" -c "
import sys
from pathlib import Path
from clinograph.secure.audit import verify_audit_dir
r = verify_audit_dir(Path('$WORK/sites/server/audit'))
print('audit verifies:', r.ok, f'({r.entries} entries)')
sys.exit(0 if r.ok else 1)"
