"""The localisation commands' default settings, apart from the analyses that use them so
that the CLI can name them in its options without importing torch."""

#: the healthy panel is every deployed-right question up to this many (task order):
#: enough to see damage rates of a few percent (the paper's 0-12%)
PANEL_CAP = 64
#: how alpha is measured: "rms" (multiples of the residual stream's RMS norm at the
#: block's layer, along unit v), "raw" (multiples of the unnormalised v) or "write"
#: (multiples of the RMS norm of what the block itself writes there, along unit v)
ALPHA_UNITS = ("rms", "raw", "write")
#: the unit counts k of the units analysis
DEFAULT_KS = (1, 4, 8, 16, 32, 64, 128)
#: random-k draws per k: the control's spread, not one lucky or unlucky draw
DEFAULT_DRAWS = 20
#: where steering and units read a block: at the end of the prompt (the default), or
#: where each deployed reply's answer starts
READ_AT = ("prompt", "answer")
