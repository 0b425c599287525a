"""Failure localisation, bottom to top: `recognition` (multiple-choice readouts, the cell
screen) -> `cohort` (failure set, healthy panel, split, the shared row runner) ->
`repair` (silencing sweeps) -> `steering` (reciprocal steering, unit analysis)."""
