"""The runtime guard: collective interception, cross-rank checks, audits."""
