"""A module that ends the process when imported (a worker must survive loading it)."""

import sys

sys.exit("this module refuses to be imported")
