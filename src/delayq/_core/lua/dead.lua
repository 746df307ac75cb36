-- dead: list dead-lettered tasks, oldest first.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] offset   ARGV[2] limit
-- Reply: per task: id, time of death ms, attempts, last error or '', envelope or ''
local offset, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local reply = {}
local rows = redis.call('ZRANGE', K_DEAD, offset, offset + limit - 1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local id = rows[i]
  reply[#reply + 1] = id
  reply[#reply + 1] = ms_of(rows[i + 1])
  reply[#reply + 1] = tonumber(redis.call('HGET', K_ATTEMPTS, id) or '0')
  reply[#reply + 1] = redis.call('HGET', K_ERRORS, id) or ''
  reply[#reply + 1] = redis.call('HGET', K_TASKS, id) or ''
end
return reply
