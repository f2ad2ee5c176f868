"""The former name of :mod:`detaug.keras.plan_ahead` (issue 40), kept because docs/keras.md told
users to set ``detaug.keras.prefetch.PLAN_AHEAD_DATA_BYTES``: importing it gives that very module,
so a value set here is the one a sequence reads."""

import sys

from detaug.keras import plan_ahead

sys.modules[__name__] = plan_ahead
