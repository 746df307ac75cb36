# The delayq command on a queue: every command reads the Redis URL from $REDIS_URL (or --redis).
id=$(delayq offer orders '{"order_id": 42}' --delay 30m --key close:42)
delayq offer orders '{"order_id": 43}' --delay 2s
delayq stats orders                                 # a table; --json for scripts
delayq inspect orders --state delayed --limit 10    # tasks by state, paged
delayq get orders "$id"                             # one task: state, due time, payload
delayq reschedule orders "$id" --delay 1h
delayq cancel orders "$id"
delayq dead orders                                  # dead letters with their last error
delayq requeue orders --all                         # deliver every dead task again
