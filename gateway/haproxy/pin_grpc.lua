-- infergate: pins an unversioned gRPC ModelInfer request to a rollout's version inside
-- HAProxy (gateway/haproxy/config.py, _rollout_rules and _pin_backends).
--
-- The frontend's rules decide (gateway/policy/rollout.py's split: rand(100) against map
-- "rollout") and leave the version in txn.ver and the message's length (its 5-byte gRPC
-- prefix, big-endian bytes 1..4) in txn.glen; such a request goes to a pin backend
-- (grpc_<pool>.pin), the only place this filter is declared, so no other request pays
-- for it. The filter appends protobuf field 2 (string model_version: tag 0x12, one
-- length byte, the decimal digits; for a singular field the last occurrence wins) at the
-- message's end and adds its size to the prefix, as gateway.policy.rollout's
-- pin_grpc_version does for the control plane. The body streams through: the prefix is
-- rewritten in the first bytes, every chunk is forwarded as it comes, and the field is
-- inserted where the message ends (the filter counts the bytes it forwarded), so a
-- message of any size, in any number of chunks, needs no more than HAProxy's buffer.
-- A content-length header (HTTP/2 allows one) is raised by the backend's own rule.

local PinGrpc = {}
PinGrpc.id = "infergate pin_grpc"
PinGrpc.flags = filter.FLT_CFG_FL_HTX
PinGrpc.__index = PinGrpc

function PinGrpc:new()
  return setmetatable({}, PinGrpc)
end

local function be32(n)
  return string.char((n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255)
end

function PinGrpc:http_headers(txn, msg)
  if msg:is_resp() then
    return filter.CONTINUE
  end
  local version, length = txn:get_var("txn.ver"), txn:get_var("txn.glen")
  if version == nil or length == nil then
    return filter.CONTINUE  -- not pinned: the body passes untouched
  end
  version = tostring(version)
  self.field = "\x12" .. string.char(#version) .. version
  self.ends = 5 + math.tointeger(tonumber(length))  -- the message's end, in body bytes
  self.seen = 0  -- body bytes forwarded so far
  self.step = 0  -- 0: the prefix to rewrite; 1: the field to insert; 2: done
  filter.register_data_filter(self, msg.channel)
  return filter.CONTINUE
end

-- Returns the bytes to forward (no value: all the input there is; a nil would be 0),
-- 0 to wait for more,
-- -1 to fail the request.
function PinGrpc:http_payload(txn, msg)
  if self.step == 2 then
    return
  end
  local input = msg:input()
  if self.step == 0 then
    if input < 5 then
      return 0
    end
    msg:set(be32(self.ends - 5 + #self.field), 1, 4)
    self.step = 1
  end
  local at = self.ends - self.seen  -- where the message ends in this input
  if at > input then
    self.seen = self.seen + input
    return input
  end
  local added
  if at == input then
    added = msg:append(self.field)
  else
    msg:forward(at)
    added = msg:prepend(self.field)
  end
  if added ~= #self.field then
    core.Alert("infergate pin_grpc: no room to append model_version")
    return -1
  end
  self.step = 2
  return
end

core.register_filter("pin_grpc", PinGrpc, function(flt, args)
  return flt
end)
