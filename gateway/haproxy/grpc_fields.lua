-- infergate: appends the fields the frontend decided to a gRPC
-- ModelInfer message inside HAProxy, as it streams through (gateway/haproxy/config.py):
--   - parameters["priority"] (txn.lvl): the class's Triton priority level at a model whose
--     dynamic batcher has levels (gateway/policy/triton_priority.py; the backends of
--     pools and models declare this filter while some model has levels,
--     gateway/haproxy/priority_rules.py): a map entry of field 4 (tag 0x22, length 14,
--     key "priority", value InferParameter{uint64_param: level}; the last entry of a
--     key wins);
--   - model_version (txn.ver): a rollout's pinned version (request_rules.py's
--     rollout_rules, gateway/policy/rollout.py's split; in the pin twins,
--     backends.py's pin_backends): field 2 (tag 0x12, one length byte, the decimal
--     digits; for a singular field the last occurrence wins).
-- In that order, as the control plane's Python plane appends them
-- (gateway/python/grpc_api.py: triton_priority.grpc_entry, then rollout's
-- pin_grpc_version), so both send the same bytes. The message's length (its 5-byte
-- prefix, big-endian bytes 1..4) is in txn.glen; the frontend sends only whole,
-- uncompressed single messages here (others go to the Python plane). No field: the body
-- passes untouched. The prefix is rewritten in the first bytes, every chunk is forwarded
-- as it comes, and the fields are inserted where the message ends (the filter counts the
-- bytes it forwarded), so a message of any size, in any number of chunks, needs no more
-- than HAProxy's buffer. A content-length header (HTTP/2 allows one) is raised by the
-- backend's own rules.

local GrpcFields = {}
GrpcFields.id = "infergate grpc_fields"
GrpcFields.flags = filter.FLT_CFG_FL_HTX
GrpcFields.__index = GrpcFields

function GrpcFields:new()
  return setmetatable({}, GrpcFields)
end

local function be32(n)
  return string.char((n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255)
end

function GrpcFields:http_headers(txn, msg)
  if msg:is_resp() then
    return filter.CONTINUE
  end
  local level, version = txn:get_var("txn.lvl"), txn:get_var("txn.ver")
  local length = txn:get_var("txn.glen")
  if (level == nil and version == nil) or length == nil then
    return filter.CONTINUE  -- nothing to append: the body passes untouched
  end
  local field = ""
  if level ~= nil then
    field = "\x22\x0e\x0a\x08priority\x12\x02\x28" .. string.char(tonumber(level))
  end
  if version ~= nil then
    version = tostring(version)
    field = field .. "\x12" .. string.char(#version) .. version
  end
  self.field = field
  self.ends = 5 + math.tointeger(tonumber(length))  -- the message's end, in body bytes
  self.seen = 0  -- body bytes forwarded so far
  self.step = 0  -- 0: the prefix to rewrite; 1: the fields to insert; 2: done
  filter.register_data_filter(self, msg.channel)
  return filter.CONTINUE
end

-- Returns the bytes to forward (no value: all the input there is; a nil would be 0),
-- 0 to wait for more,
-- -1 to fail the request.
function GrpcFields:http_payload(txn, msg)
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
    core.Alert("infergate grpc_fields: no room to append the fields")
    return -1
  end
  self.step = 2
  return
end

core.register_filter("grpc_fields", GrpcFields, function(flt, args)
  return flt
end)
