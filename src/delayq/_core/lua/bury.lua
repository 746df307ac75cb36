-- bury: dead-letter a task that was already removed (at-most-once delivery that could not
-- be decoded), so the bad entry is kept for inspection rather than lost.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] id   ARGV[2] envelope   ARGV[3] slot   ARGV[4] error
-- Reply: 1
local id, envelope, slot, err = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = now_ms()
redis.call('HSET', K_TASKS, id, envelope)
bury(id, slot, now, err)
count('decode_failures', 1)
return 1
