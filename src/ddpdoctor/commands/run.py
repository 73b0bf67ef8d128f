from ._pending import pending

add_arguments, run = pending("run", 4)
