from ._pending import pending

add_arguments, run = pending("report", 6)
