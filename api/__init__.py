"""The HTTP API: the app factory, what every route shares (auth, errors, body limits), one package per area."""
