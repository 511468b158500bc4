"""The common core shared by the API and every worker stage."""
