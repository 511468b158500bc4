"""The node gateway: what the pool reaches instead of a vLLM server bound to loopback.

vLLM's RL routes (pause, reload, bytes upload, weight version) exist only in its dev mode and must
never face a network; its own `--api-key` guards only the /v1 routes. On a shared cluster the
gateway is what listens on the node's address: it forwards a short list of routes, data routes to
holders of the deployment token and control routes to holders of the admin token, checks a control
call's body before vLLM sees it, and streams every answer through unbuffered.
"""
