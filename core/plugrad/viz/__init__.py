"""VIZ: record graph rewrites and kernel codegen (VIZ=1) and a profile of launches, copies and memory (PROFILE=1),
then look at them in a local web page (docs/viz.md).

`capture` is the recording (imported by the rewrite engine and the runtime); `trace` turns a recording into a
JSON-able trace and Chrome trace-event JSON; `graph` replays and draws rewrite steps; `server` serves the page;
`session` runs the exit hooks. `python -m plugrad.viz TRACE_FILE` reopens a saved trace.
"""
