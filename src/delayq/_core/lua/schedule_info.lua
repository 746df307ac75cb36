-- schedule_info: what Redis holds for some schedules (or all, with no names).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] how many cron times ahead to return   ARGV[2..] names (none = every live schedule)
-- Reply: {now ms, then per schedule: name, its state hash as a flat list, cron times ahead}
--        (a name that is not a live schedule is left out; one a reshard moved away has
--        the state {'mv', the (sub-)queue it went to} and no times)
local now = now_ms()
local names = {}
if #ARGV > 1 then
  for i = 2, #ARGV do names[#names + 1] = ARGV[i] end
else
  names = redis.call('HKEYS', sched_key('sched'))
end
local reply = {now}
for _, name in ipairs(names) do
  local st_key = sched_key('sched:st:' .. name)
  local state = redis.call('HMGET', st_key, 'gone', 'mv')
  if state[1] == '0' then
    reply[#reply + 1] = name
    reply[#reply + 1] = redis.call('HGETALL', st_key)
    reply[#reply + 1] = redis.call('ZRANGE', sched_key('sched:at:' .. name), 0,
      tonumber(ARGV[1]) - 1)
  elseif state[2] then  -- a reshard moved it: the caller's layout is out of date
    reply[#reply + 1] = name
    reply[#reply + 1] = {'mv', state[2]}
    reply[#reply + 1] = {}
  end
end
return reply
