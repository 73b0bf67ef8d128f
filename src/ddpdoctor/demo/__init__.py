"""`ddpdoctor demo`: the examples under examples/ as a self-verifying tour (manifest: reading and running
them; tour: one class\x27s steps)."""
