"""kvstore's stand-in for the `mooncake` package, on the path only when the alias is switched on
(kvstore/compat/mooncake/alias.py): `mooncake.store` is kvstore's Mooncake-compatible API, every
other module comes from the installed Mooncake wheel."""

from kvstore.compat.mooncake.alias import adopt as _adopt

_adopt(globals())
del _adopt
