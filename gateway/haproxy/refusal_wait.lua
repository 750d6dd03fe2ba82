-- infergate: the rest of a tenancy refusal's delay, before HAProxy's tarpit waits the
-- tenancy's refusal_delay_ms (gateway/haproxy/admission_rules.py, _refuse).
--
-- The frontend's rules leave in txn.rx the milliseconds beyond that delay that
-- gateway.policy.tenancy.refusal_delay_ms gives a tenant with many refusals waiting (its
-- refusals waiting x 1000 / refusals_per_s, at most 1 s in all, within 9/10 of the
-- request's deadline). Only such refusals run this action: an admitted request never
-- does, nor a refusal that waits the tarpit alone. core.msleep yields: the stream waits
-- on its own, no thread is held, and the sleep does not count as Lua run time.

core.register_action("infergate_refusal_wait", { "http-req" }, function(txn)
  local ms = tonumber(txn:get_var("txn.rx"))
  if ms ~= nil and ms > 0 then
    core.msleep(ms)
  end
end)
