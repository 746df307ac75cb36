-- history: a queue's task-history settings (docs/history.md; the keys are in _lib.lua).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] 'get'; 'set' with ARGV[2] ms a history is kept after its task ends, ARGV[3] most
--         events kept per task, ARGV[4] most bytes of an event's detail; 'off'; or 'sweep'
--         with ARGV[2] an HSCAN cursor of the tasks hash and ARGV[3] how many to look at:
--         after 'off', delete the histories of tasks still in the queue (nothing records
--         their end any more, so nothing would give them an expiry)
-- Reply: get, set, off: the settings before, {ret, max, bytes}, or {} when it was off;
--        sweep: the next cursor ('0' when done).
local action = ARGV[1]
local key = flow_key('hist')
if action == 'sweep' then
  local page = redis.call('HSCAN', K_TASKS, ARGV[2], 'COUNT', tonumber(ARGV[3]))
  local lists = {}
  for i = 1, #page[2], 2 do lists[#lists + 1] = flow_key('hist:' .. page[2][i]) end
  if #lists > 0 then redis.call('DEL', unpack(lists)) end
  return page[1]
end
local before = redis.call('HMGET', key, 'ret', 'max', 'bytes')
if not before[1] then before = {} end
if action == 'set' then
  redis.call('HSET', key, 'ret', ARGV[2], 'max', ARGV[3], 'bytes', ARGV[4])
  redis.call('HSET', K_COUNTERS, 'hist', 1)  -- the mirror the offer scripts look at
elseif action == 'off' then
  redis.call('DEL', key)
  redis.call('HDEL', K_COUNTERS, 'hist')
end
return before
