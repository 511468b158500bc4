"""An external agent's endpoint: its calls checked and forwarded to the worker serving its job."""
