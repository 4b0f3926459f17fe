"""A model call, end to end: who serves it and how its API is spoken (providers, api_shapes), what
it costs (prices), what a call may ask (request_rules), the metering proxy that forwards, charges
and records every call of a run (proxy, endpoint), the run's connection to it and its calls as
events (metering), and the review judge's model (judge_model). Imports mlrb.core alone (and the
providers' SDKs, lazily); agents, the harness, the sandboxes and the review use it."""
