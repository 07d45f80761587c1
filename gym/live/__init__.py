"""Learning from live use: the proxy in front of a user's own harness on their own machine.

`harnessrl serve` (`serve`) runs the proxy over a private store folder (`privacy`: 0700/0600)
with no sandbox and no task; each harness process gets its own session (a per-session key in
its base URL), recorded token-exact like any episode. A reward arrives later, as feedback
(`feedback`: the admin route `POST /admin/sessions/{sid}/feedback` or `harnessrl feedback`);
`harnessrl sessions` lists, shows, opens and deletes sessions (`sessions`). Sessions without
a reward are never trained; `harnessrl train` takes rewarded ones through its `[live]`
section (`trainers.live`). Contract and privacy: docs/serve.md.
"""
