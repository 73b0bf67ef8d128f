from ._pending import pending

add_arguments, run = pending("env", 6)
