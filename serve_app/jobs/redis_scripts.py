"""The Redis side of the Redis job book (serve_app/jobs/redis_book.py): its
keys (one prefix per application; standalone Redis only: the scripts build
key names from the prefix, so a Redis Cluster could not route them), each
atomic step as a Lua script (submit, claim, renew, progress, finish, forget,
expire), and the check that the server keeps the durability
promise (appendonly, appendfsync). No Ray import."""

from __future__ import annotations

from typing import Optional

from serve_app.core.errors import ConfigError


_FORGET = """
-- an open delivery done (or dropped): out of the open set and its client's count
local function cb_close(P, id)
  if redis.call('SREM', P..'cbopen', id) == 1 then
    local c = redis.call('HGET', P..'cb:'..id, 'client') or ''
    if redis.call('HINCRBY', P..'cbclient', c, -1) <= 0 then redis.call('HDEL', P..'cbclient', c) end
  end
end

local function forget(P, id)
  local j = P..'job:'..id
  local h = redis.call('HMGET', j, 'client', 'size', 'key', 'status')
  local c, size, key, st = h[1] or '', tonumber(h[2] or '0'), h[3], h[4]
  if redis.call('ZREM', P..'fin', id) == 0 then return end
  redis.call('ZREM', P..'finc:'..c, id)
  redis.call('HINCRBY', P..'stats', 'fcount', -1)
  redis.call('HINCRBY', P..'stats', 'fbytes', -size)
  if st then redis.call('HINCRBY', P..'stats', st, -1) end
  if redis.call('HINCRBY', P..'ccount', c, -1) <= 0 then
    redis.call('HDEL', P..'ccount', c)
    redis.call('HDEL', P..'cbytes', c)
  else
    redis.call('HINCRBY', P..'cbytes', c, -size)
  end
  if key and key ~= '' and redis.call('GET', P..'key:'..key) == id then redis.call('DEL', P..'key:'..key) end
  redis.call('DEL', j)
  if not redis.call('ZSCORE', P..'cbq', id) then  -- its delivery, unless one is still to be sent
    cb_close(P, id)
    redis.call('DEL', P..'cb:'..id)
  end
end

local function over(P, c, share_count, share_bytes)
  return tonumber(redis.call('HGET', P..'ccount', c) or '0') > share_count
      or tonumber(redis.call('HGET', P..'cbytes', c) or '0') > share_bytes
end

-- past the TTL; then `client`'s oldest while it is over its share, or while
-- the store is over its bounds and it holds more than its newest; never
-- another client's (serve_app.jobs.results' rules)
local function evict(P, now, ttl, client, max_count, max_bytes, share_count, share_bytes)
  local gone = 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P..'fin', '-inf', now - ttl, 'LIMIT', 0, 256)) do
    forget(P, id)
    gone = gone + 1
  end
  if client ~= '' then
    for _ = 1, 100000 do
      local mine = tonumber(redis.call('HGET', P..'ccount', client) or '0')
      local store_over = tonumber(redis.call('HGET', P..'stats', 'fcount') or '0') > max_count
          or tonumber(redis.call('HGET', P..'stats', 'fbytes') or '0') > max_bytes
      if not (over(P, client, share_count, share_bytes) or (store_over and mine > 1)) then break end
      local oldest = redis.call('ZRANGE', P..'finc:'..client, 0, 0)[1]
      if not oldest then break end
      forget(P, oldest)
      gone = gone + 1
    end
  end
  return gone
end

-- a queued job in its lane's queue and its client's (the workers take the
-- clients of a lane in turn: qc:<lane> scores each client by its last turn;
-- a newcomer's is just before the last turn given)
local function enqueue(P, lane, client, created, id)
  redis.call('ZADD', P..'q:'..lane, created, id)
  redis.call('ZADD', P..'q:'..lane..':c:'..client, created, id)
  -- a client that arrives (or comes back) goes ahead of the one served last (its score is the last turn)
  redis.call('ZADD', P..'qc:'..lane, 'NX', tonumber(redis.call('GET', P..'turn') or '0') - 0.5, client)
end

local function dequeue(P, lane, client, id)
  redis.call('ZREM', P..'q:'..lane, id)
  local cq = P..'q:'..lane..':c:'..client
  redis.call('ZREM', cq, id)
  if redis.call('ZCARD', cq) == 0 then redis.call('ZREM', P..'qc:'..lane, client) end
end
"""

# ARGV: P id key capacity max_bytes nbytes lane created options kind fingerprint client image
#       client_jobs client_bytes max_count max_fbytes alone_jobs alone_bytes callback max_pending
#       max_pending_per_client document
_SUBMIT = _FORGET + """
local P, id, key = ARGV[1], ARGV[2], ARGV[3]
if key ~= '' then
  local other = redis.call('GET', P..'key:'..key)
  if other then return {'dup', other} end
end
local client = ARGV[12]
local unfinished = tonumber(redis.call('HGET', P..'stats', 'unfinished') or '0')
local held = tonumber(redis.call('HGET', P..'stats', 'held') or '0')
if unfinished >= tonumber(ARGV[4]) then return {'full', tostring(unfinished)} end
if held + tonumber(ARGV[6]) > tonumber(ARGV[5]) then return {'bytes', tostring(held)} end
local mine = tonumber(redis.call('HGET', P..'ucount', client) or '0')
local mine_bytes = tonumber(redis.call('HGET', P..'ubytes', client) or '0')
-- alone in the book (no other client holds an unfinished job): all of it but one share (ARGV 18, 19)
local alone = redis.call('HLEN', P..'ucount') - redis.call('HEXISTS', P..'ucount', client) == 0
local max_jobs, max_held = tonumber(ARGV[14]), tonumber(ARGV[15])
if alone then max_jobs, max_held = tonumber(ARGV[18]), tonumber(ARGV[19]) end
if mine >= max_jobs or mine_bytes + tonumber(ARGV[6]) > max_held then
  return {'mine', tostring(mine)..' '..tostring(mine_bytes)..' '..(alone and '1' or '0')}
end
if tonumber(redis.call('HGET', P..'ccount', client) or '0') == 0 then
  local fcount = tonumber(redis.call('HGET', P..'stats', 'fcount') or '0')
  local fbytes = tonumber(redis.call('HGET', P..'stats', 'fbytes') or '0')
  if fcount + unfinished >= tonumber(ARGV[16]) or fbytes >= tonumber(ARGV[17]) then
    local oldest = redis.call('ZRANGE', P..'fin', 0, 0, 'WITHSCORES')
    return {'results', oldest[2] or '0'}
  end
end
if ARGV[20] ~= '' then
  local open = redis.call('SCARD', P..'cbopen')
  if open >= tonumber(ARGV[21]) then return {'callbacks', tostring(open)} end
  local theirs = tonumber(redis.call('HGET', P..'cbclient', client) or '0')
  if theirs >= tonumber(ARGV[22]) then return {'mycallbacks', tostring(theirs)} end
  redis.call('HSET', P..'cb:'..id, 'rec', ARGV[20], 'state', 'waiting', 'client', client)
  redis.call('SADD', P..'cbopen', id)
  redis.call('HINCRBY', P..'cbclient', client, 1)
end
redis.call('HSET', P..'job:'..id, 'status', 'queued', 'created', ARGV[8], 'key', key, 'options', ARGV[9],
           'kind', ARGV[10], 'fingerprint', ARGV[11], 'client', ARGV[12], 'nbytes', ARGV[6], 'lane', ARGV[7],
           'claims', '0', 'document', ARGV[23])
redis.call('SET', P..'img:'..id, ARGV[13])
if key ~= '' then redis.call('SET', P..'key:'..key, id) end
enqueue(P, ARGV[7], client, ARGV[8], id)
redis.call('HINCRBY', P..'stats', 'unfinished', 1)
redis.call('HINCRBY', P..'stats', 'held', ARGV[6])
redis.call('HINCRBY', P..'ucount', client, 1)
redis.call('HINCRBY', P..'ubytes', client, ARGV[6])
return {'ok', id}
"""

# ARGV: P now lease_deadline bulk_max_wait owner
_CLAIM = _FORGET + """
local P, now = ARGV[1], tonumber(ARGV[2])
-- jobs whose lease ran out (their worker died): back to their queue
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P..'lease', '-inf', now, 'LIMIT', 0, 16)) do
  redis.call('ZREM', P..'lease', id)
  local j = P..'job:'..id
  if redis.call('HGET', j, 'status') == 'running' then
    redis.call('HSET', j, 'status', 'queued')
    redis.call('HDEL', j, 'owner', 'started')
    if redis.call('HEXISTS', j, 'pages_total') == 1 then redis.call('HSET', j, 'pages_done', '0') end
    redis.call('DEL', P..'pg:'..id)
    local h = redis.call('HMGET', j, 'lane', 'client', 'created')
    enqueue(P, h[1], h[2] or '', h[3], id)
  end
end
local b = redis.call('ZRANGE', P..'q:bulk', 0, 0, 'WITHSCORES')
local i = redis.call('ZRANGE', P..'q:interactive', 0, 0)
local lane
if b[1] and now - tonumber(b[2]) >= tonumber(ARGV[4]) then lane = 'bulk'
elseif i[1] then lane = 'interactive'
elseif b[1] then lane = 'bulk'
else return false end
-- the lane's next client in turn, its oldest job
local client = redis.call('ZRANGE', P..'qc:'..lane, 0, 0)[1]
local id = client and redis.call('ZRANGE', P..'q:'..lane..':c:'..client, 0, 0)[1]
if not id then  -- (a job queued before the clients' queues: the lane's oldest)
  id = (lane == 'bulk') and b[1] or i[1]
  client = redis.call('HGET', P..'job:'..id, 'client') or ''
end
dequeue(P, lane, client, id)
if redis.call('ZSCORE', P..'qc:'..lane, client) then
  redis.call('ZADD', P..'qc:'..lane, 'XX', redis.call('INCR', P..'turn'), client)
end
redis.call('ZADD', P..'lease', ARGV[3], id)
local j = P..'job:'..id
redis.call('HSET', j, 'status', 'running', 'owner', ARGV[5], 'started', ARGV[2])
return {id, redis.call('HINCRBY', j, 'claims', 1)}
"""

# ARGV: P id owner deadline
_RENEW = """
local j = ARGV[1]..'job:'..ARGV[2]
if redis.call('HGET', j, 'owner') ~= ARGV[3] then return 0 end
redis.call('ZADD', ARGV[1]..'lease', 'XX', ARGV[4], ARGV[2])
return 1
"""

# ARGV: P id owner pages_done pages_total
_PROGRESS = """
local j = ARGV[1]..'job:'..ARGV[2]
if redis.call('HGET', j, 'owner') ~= ARGV[3] then return 0 end
local done = tonumber(redis.call('HGET', j, 'pages_done') or '-1')
if tonumber(ARGV[4]) >= done then redis.call('HSET', j, 'pages_done', ARGV[4], 'pages_total', ARGV[5]) end
return 1
"""

# ARGV: P id status result error finished size now ttl max_count max_bytes share_count share_bytes callback
_FINISH = _FORGET + """
local P, id = ARGV[1], ARGV[2]
local j = P..'job:'..id
local st = redis.call('HGET', j, 'status')
if st ~= 'running' and st ~= 'queued' then return -1 end -- finished by another worker already, or gone
local client = redis.call('HGET', j, 'client') or ''
local nbytes = tonumber(redis.call('HGET', j, 'nbytes') or '0')
local lane = redis.call('HGET', j, 'lane') or 'bulk'
if redis.call('HINCRBY', P..'ucount', client, -1) <= 0 then
  redis.call('HDEL', P..'ucount', client)
  redis.call('HDEL', P..'ubytes', client)
else
  redis.call('HINCRBY', P..'ubytes', client, -nbytes)
end
redis.call('HSET', j, 'status', ARGV[3], 'finished', ARGV[6], 'size', ARGV[7])
if ARGV[4] ~= '' then redis.call('HSET', j, 'result', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', j, 'error', ARGV[5]) end
redis.call('HDEL', j, 'owner')
redis.call('DEL', P..'img:'..id)
redis.call('DEL', P..'pg:'..id)  -- its pages read so far: the result holds them now
redis.call('ZREM', P..'lease', id)
dequeue(P, lane, client, id)
redis.call('HINCRBY', P..'stats', 'unfinished', -1)
redis.call('HINCRBY', P..'stats', 'held', -nbytes)
redis.call('HINCRBY', P..'stats', ARGV[3], 1)
redis.call('ZADD', P..'fin', ARGV[6], id)
redis.call('ZADD', P..'finc:'..client, ARGV[6], id)
redis.call('HINCRBY', P..'stats', 'fcount', 1)
redis.call('HINCRBY', P..'stats', 'fbytes', ARGV[7])
redis.call('HINCRBY', P..'ccount', client, 1)
redis.call('HINCRBY', P..'cbytes', client, ARGV[7])
-- its waiting delivery (ARGV 14: the record made due, its body fixed) is due now
if ARGV[14] ~= '' and redis.call('HGET', P..'cb:'..id, 'state') == 'waiting' then
  redis.call('HSET', P..'cb:'..id, 'rec', ARGV[14], 'state', 'pending')
  redis.call('ZADD', P..'cbq', ARGV[6], id)
end
return evict(P, tonumber(ARGV[8]), tonumber(ARGV[9]), client, tonumber(ARGV[10]), tonumber(ARGV[11]),
             tonumber(ARGV[12]), tonumber(ARGV[13]))
"""

# ARGV: P id
_FORGET_ONE = _FORGET + """
forget(ARGV[1], ARGV[2])
return 1
"""

# ARGV: P now ttl max_count max_bytes share_count share_bytes
_EXPIRE = _FORGET + """
return evict(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), '', tonumber(ARGV[4]), tonumber(ARGV[5]),
             tonumber(ARGV[6]), tonumber(ARGV[7]))
"""


# Deliveries due now (at most ARGV 4), no host past ARGV 6 in flight with
# this replica's (ARGV 7, JSON host -> count), each claimed until ARGV 3 (its
# attempt's time and more: a replica that dies mid-attempt leaves it to be
# sent again) under a token (ARGV 9 and its id) that its outcome must show
# (_CB_RECORD). One passed over for a busy host is looked at again from ARGV
# 8 on, out of this scan's way: up to 4 windows of ARGV 5 are scanned, so
# due deliveries to busy hosts cannot hide the others.
# ARGV: P now claim_until n window per_target busy later token
_CB_CLAIM = """
local P = ARGV[1]
local n, window, per_target, busy = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), cjson.decode(ARGV[7])
local out = {}
for _ = 1, 4 do
  local ids = redis.call('ZRANGEBYSCORE', P..'cbq', '-inf', ARGV[2], 'LIMIT', 0, window)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if #out >= 3 * n then break end
    local rec = redis.call('HGET', P..'cb:'..id, 'rec')
    if not rec then
      redis.call('ZREM', P..'cbq', id)
    else
      local host = cjson.decode(rec).host or ''
      local held = tonumber(busy[host] or 0)
      if held < per_target then
        busy[host] = held + 1
        local token = ARGV[9]..':'..id
        redis.call('HSET', P..'cb:'..id, 'token', token)
        redis.call('ZADD', P..'cbq', ARGV[3], id)
        table.insert(out, id)
        table.insert(out, rec)
        table.insert(out, token)
      else
        redis.call('ZADD', P..'cbq', ARGV[8], id)
      end
    end
  end
  if #out >= 3 * n then break end
end
return out
"""

# An attempt's outcome, if its claim (ARGV 6) still holds: a late outcome
# after another replica claimed it again changes nothing (compare and set).
# A delivery done whose job is gone leaves the book.
# ARGV: P id rec state next_attempt_at token
_CB_RECORD = _FORGET + """
local P, id = ARGV[1], ARGV[2]
local cb = P..'cb:'..id
if redis.call('EXISTS', cb) == 0 then return 0 end
if redis.call('HGET', cb, 'token') ~= ARGV[6] then return 0 end
redis.call('HSET', cb, 'rec', ARGV[3], 'state', ARGV[4])
redis.call('HDEL', cb, 'token')
if ARGV[4] == 'pending' then
  redis.call('ZADD', P..'cbq', ARGV[5], id)
else
  redis.call('ZREM', P..'cbq', id)
  cb_close(P, id)
  if redis.call('EXISTS', P..'job:'..id) == 0 then redis.call('DEL', cb) end
end
return 1
"""


# A job's status, its page counts, whether it is a document, its error, and
# page N if read while it runs (one round trip).
# ARGV: P id n
_PAGE = """
local h = redis.call('HMGET', ARGV[1]..'job:'..ARGV[2], 'status', 'pages_done', 'pages_total', 'document', 'error')
return {h[1], h[2], h[3], redis.call('HGET', ARGV[1]..'pg:'..ARGV[2], ARGV[3]), h[4], h[5]}
"""


def redis_prefix(app_name: str) -> str:
    """The keys of one application's book: `ocr:{app}:...` (one hash slot)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in (app_name or "default"))
    return f"ocr:{{{safe}}}:"


def check_fsync(config: dict, wanted: str) -> Optional[str]:
    """CONFIG GET appendonly/appendfsync against jobs.redis_fsync: raises
    ConfigError when the server cannot keep the promise, returns a warning
    when it keeps a weaker one than `always`, else None."""
    appendonly, appendfsync = config.get("appendonly"), config.get("appendfsync")
    fix = ("start the server with `--appendonly yes --appendfsync always` (or CONFIG SET them), or set "
           "jobs.redis_fsync to `everysec` (up to a second of accepted jobs may be lost if the server's "
           "machine dies) or `any` (not checked)")
    if appendonly != "yes":
        raise ConfigError(f"the job book's Redis has appendonly {appendonly!r}: accepted jobs would be lost "
                          f"when it restarts; {fix}")
    if wanted == "always" and appendfsync != "always":
        raise ConfigError(f"the job book's Redis has appendfsync {appendfsync!r}, but jobs.redis_fsync is "
                          f"`always` (a job on disk before its 202); {fix}")
    if appendfsync != "always":
        return (f"the job book's Redis has appendfsync {appendfsync!r}: a job answered 202 may be lost "
                f"if the server's machine dies within a second")
    return None
