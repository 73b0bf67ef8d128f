from ._pending import pending

add_arguments, run = pending("check", 3)
