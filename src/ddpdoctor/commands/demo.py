from ._pending import pending

add_arguments, run = pending("demo", 6)
