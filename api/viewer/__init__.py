"""The trajectory viewer: one static page (api/static/) and its assets."""
