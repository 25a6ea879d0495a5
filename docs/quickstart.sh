# A whole overlay on this machine: a key server, one root peer, one subscriber and a
# publisher. Runs from any directory, in a new temporary directory, and stops everything
# it started when it ends. A bash script: needs bash and `ibe-pubsub` on PATH. It all runs
# in a subshell ( ... ), so pasting it into bash is safe: its settings and processes end
# with it.
(
set -euo pipefail
# Only this script's settings: none of the user's IBE_PUBSUB_* variables (a database URL,
# a token, ...) reaches the processes it starts.
unset $(compgen -v IBE_PUBSUB_)

# Ports: the usual ones, or others from the environment.
KEYSERVER_PORT=${KEYSERVER_PORT:-8700}
ROOT_PORT=${ROOT_PORT:-9001}
SUBSCRIBER_PORT=${SUBSCRIBER_PORT:-9101}
SERVER=http://127.0.0.1:$KEYSERVER_PORT

WORK=$(mktemp -d)
cd "$WORK"
echo "quickstart: working in $WORK"
export IBE_PUBSUB_PASSPHRASE='a long passphrase'   # seals the key server's master secret
export IBE_PUBSUB_PUBLISHED_IDS=$WORK/published_ids.json   # the ids `publish` sent, kept here

# On exit, also after a failure or Ctrl-C: stop the background processes.
stop_all() {
    kill $(jobs -p) 2>/dev/null || true
    wait
}
trap stop_all EXIT
trap 'exit 1' INT TERM

# wait_for FILE PID LOG: wait up to 60 s for FILE while process PID runs.
wait_for() {
    for _ in $(seq 120); do
        if [ -e "$1" ]; then return 0; fi
        if ! kill -0 "$2" 2>/dev/null; then
            echo "quickstart: process $2 exited; the end of $3:" >&2
            tail -n 20 "$3" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "quickstart: no $1 after 60 s; see $WORK/$3" >&2
    exit 1
}

# 1. The key server, with the built-in stock-quote schema. `init` prints the server's
#    signing key on stdout: the peers pin it.
SERVER_KEY=$(ibe-pubsub keyserver init --data ks --schema stocks)
ibe-pubsub keyserver serve --data ks --port "$KEYSERVER_PORT" \
    --ready-file keyserver.ready 2> keyserver.log &
wait_for keyserver.ready $! keyserver.log

# 2. Three identities; `identity add` prints the new token alone on stdout.
#    --allow bounds what an identity may subscribe to or publish.
ROOT_TOKEN=$(ibe-pubsub identity add --server "$SERVER" --admin-token-file ks/admin.token \
    --name root --role root)
SUBSCRIBER_TOKEN=$(ibe-pubsub identity add --server "$SERVER" \
    --admin-token-file ks/admin.token \
    --name ib-watcher --role subscriber --allow 'symbol prefix "IB"')
PUBLISHER_TOKEN=$(ibe-pubsub identity add --server "$SERVER" \
    --admin-token-file ks/admin.token \
    --name quotes --role publisher --allow 'price < 500')

# 3. One root peer for all three attribute trees, then a subscriber.
IBE_PUBSUB_TOKEN=$ROOT_TOKEN ibe-pubsub peer run --server "$SERVER" \
    --server-key "$SERVER_KEY" --listen "127.0.0.1:$ROOT_PORT" \
    --root symbol --root price --root volume \
    --ready-file root.ready 2> root.log &
wait_for root.ready $! root.log

IBE_PUBSUB_TOKEN=$SUBSCRIBER_TOKEN ibe-pubsub peer run --server "$SERVER" \
    --server-key "$SERVER_KEY" --listen "127.0.0.1:$SUBSCRIBER_PORT" \
    --subscribe 'symbol prefix "IB" and price in [100, 200]' \
    --events-out delivered.jsonl --ready-file subscriber.ready 2> subscriber.log &
wait_for subscriber.ready $! subscriber.log

# 4. Publish four quotes; q1 and q4 match the subscription.
cat > events.jsonl <<'EOF'
{"id": "q1", "values": {"symbol": "IBM", "price": 150.5, "volume": 1200}, "body": "IBM 150.50"}
{"id": "q2", "values": {"symbol": "IBM", "price": 250.0, "volume": 800}, "body": "IBM 250.00"}
{"id": "q3", "values": {"symbol": "AAPL", "price": 180.25, "volume": 5000}, "body": "AAPL 180.25"}
{"id": "q4", "values": {"symbol": "IBKR", "price": 120.0, "volume": 300}, "body": "IBKR 120.00"}
EOF
IBE_PUBSUB_TOKEN=$PUBLISHER_TOKEN ibe-pubsub publish --server "$SERVER" \
    --server-key "$SERVER_KEY" --advertise 'price < 500' --events events.jsonl

# 5. Wait up to 30 s for the two deliveries, and show them.
for _ in $(seq 60); do
    if [ "$(wc -l < delivered.jsonl)" -ge 2 ]; then
        echo "quickstart: delivered to the subscriber:"
        cat delivered.jsonl
        exit 0
    fi
    sleep 0.5
done
echo "quickstart: the subscriber did not get both events in 30 s; see $WORK" >&2
exit 1
)
