from ._pending import pending

add_arguments, run = pending("explain", 5)
