-- infergate: gives Triton an HTTP inference request's priority level inside HAProxy
-- (gateway/policy/triton_priority.py; gRPC's is grpc_fields.lua). The Python plane
-- sets the same key in the parsed header (gateway/python/http_api.py's
-- with_parameters). Declared in the HTTP backends of the pools and models only while a
-- model has levels and tenants have classes (gateway/haproxy/priority_rules.py); a
-- request without a level passes untouched.
--
-- The frontend's rules leave the level in txn.lvl (map "tprio": model/class -> level);
-- a backend's rules raise content-length and Inference-Header-Content-Length (the
-- length of a binary request's JSON header) by ADDED, this filter's fixed addition.
-- Triton reads the first "parameters" object and the first "priority" in it, so the
-- filter scans the JSON as it streams through and inserts
--   - "priority":N first in the top-level "parameters" object, then "," or nothing
--     (an empty object) and spaces up to ADDED bytes; or
--   - ,"parameters":{"priority":N} before the top-level object's closing brace when it
--     had none ("parameters":... without the comma in an empty object, then a space).
-- A body whose JSON is not an object gets ADDED spaces at its end, so its length is
-- what the headers say and Triton answers it with a parse error, as before (a binary
-- request's header that does not parse fails there either way). Each chunk is
-- forwarded as it is scanned; the scan jumps from one significant byte to the next
-- (string.find), and once the level is in, the rest passes unread.

local PriorityHttp = {}
PriorityHttp.id = "infergate priority_http"
PriorityHttp.flags = filter.FLT_CFG_FL_HTX
PriorityHttp.__index = PriorityHttp

local ADDED = 28  -- gateway.policy.triton_priority.HTTP_ADDED
local QUOTE, BACKSLASH, COLON, COMMA = 34, 92, 58, 44
local OPEN_OBJECT, CLOSE_OBJECT, OPEN_ARRAY = 123, 125, 91
-- what matters at the top level, and deeper (only nesting and strings)
local TOP, DEEP, IN_STRING, NOT_SPACE = '[",:{}%[%]]', '["{}%[%]]', '["\\]', '[^ \t\r\n]'

function PriorityHttp:new()
  return setmetatable({}, PriorityHttp)
end

function PriorityHttp:http_headers(txn, msg)
  if msg:is_resp() then
    return filter.CONTINUE
  end
  local level = txn:get_var("txn.lvl")
  if level == nil then
    return filter.CONTINUE  -- no level: the body passes untouched
  end
  self.level = tostring(level)
  self.depth = 0
  self.in_string, self.escaped = false, false
  self.key = nil          -- a top-level key being read
  self.expect_key = false -- at the top level, the next string is a key
  self.members = false    -- the top-level object has a member
  self.params = 0         -- 1: key "parameters" read; 2: its ":" too; 3: level in, separator next
  self.done = false       -- the level is in: the rest passes
  self.skip = false       -- not an object: spaces at the end
  filter.register_data_filter(self, msg.channel)
  return filter.CONTINUE
end

-- text, padded with spaces to ADDED bytes
local function padded(text)
  return text .. string.rep(" ", ADDED - #text)
end

-- Forwards the input before byte `at` of data (1-based) not forwarded yet, then puts
-- `text` there and forwards it. Returns the bytes of data now forwarded, or nil when
-- the buffer had no room.
local function put(msg, base, at, text)
  if at - 1 > base then
    msg:forward(at - 1 - base)
  end
  if msg:prepend(text) ~= #text then
    core.Alert("infergate priority_http: no room to insert the priority")
    return nil
  end
  msg:forward(#text)
  return at - 1
end

-- At the end of a body the level never went into: ADDED spaces. Returns -1 (fail the
-- request) when the buffer has no room.
local function spaces_at_end(self, msg)
  if msg:eom() then
    self.done = true
    if msg:append(string.rep(" ", ADDED)) ~= ADDED then
      core.Alert("infergate priority_http: no room to pad the body")
      return -1
    end
  end
end

-- Returns the bytes to forward (no value: all the input there is), -1 to fail.
function PriorityHttp:http_payload(txn, msg)
  if self.done then
    return
  end
  local input = msg:input()
  if self.skip or input == 0 then
    return spaces_at_end(self, msg)
  end
  local data = msg:body(0, input)
  local i, base, n = 1, 0, #data
  while i <= n do
    if self.escaped then  -- the byte after a backslash, in the chunk before
      self.escaped = false
      if self.key then self.key = self.key .. data:sub(i, i) end
      i = i + 1
    elseif self.in_string then
      local j = data:find(IN_STRING, i)
      if j == nil then
        if self.key then self.key = self.key .. data:sub(i) end
        i = n + 1
      else
        if self.key then self.key = self.key .. data:sub(i, j - 1) end
        if data:byte(j) == BACKSLASH then
          if j == n then
            self.escaped = true
          elseif self.key then
            self.key = self.key .. data:sub(j, j + 1)
          end
          i = j + 2
        else
          self.in_string = false
          if self.key then
            self.params = self.key == "parameters" and 1 or 0
            self.key = nil
          end
          i = j + 1
        end
      end
    elseif self.params == 3 then  -- the level is in: "," unless the object was empty
      local j = data:find(NOT_SPACE, i)
      if j == nil then
        i = n + 1
      else
        local after = data:byte(j) == CLOSE_OBJECT and "" or ","
        local rest = ADDED - #('"priority":' .. self.level)
        if put(msg, base, j, after .. string.rep(" ", rest - #after)) == nil then
          return -1
        end
        self.done = true
        return
      end
    else
      local j = data:find(self.depth == 1 and TOP or DEEP, i)
      if j == nil then
        i = n + 1
      else
        local c = data:byte(j)
        i = j + 1
        if c == QUOTE then
          self.in_string = true
          if self.depth == 1 and self.expect_key then
            self.key, self.expect_key, self.members = "", false, true
          end
        elseif c == COLON then
          if self.params == 1 then self.params = 2 end
        elseif c == COMMA then
          self.expect_key, self.params = true, 0
        elseif c == OPEN_OBJECT or c == OPEN_ARRAY then
          self.depth = self.depth + 1
          if self.depth == 1 then
            if c == OPEN_ARRAY then  -- not an object: spaces at the end
              self.skip = true
              return spaces_at_end(self, msg)
            end
            self.expect_key = true
          elseif self.depth == 2 and self.params == 2 and c == OPEN_OBJECT then
            base = put(msg, base, j + 1, '"priority":' .. self.level)
            if base == nil then return -1 end
            self.params = 3
          else
            self.params = 0
          end
        else  -- a closing brace or bracket
          self.depth = self.depth - 1
          if self.depth == 0 then  -- the top-level object ends here: no parameters
            local text = '"parameters":{"priority":' .. self.level .. '}'
            if put(msg, base, j, padded((self.members and "," or "") .. text)) == nil then
              return -1
            end
            self.done = true
            return
          end
        end
      end
    end
  end
  return spaces_at_end(self, msg)
end

core.register_filter("priority_http", PriorityHttp, function(flt, args)
  return flt
end)

