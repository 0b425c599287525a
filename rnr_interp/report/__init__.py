"""HTML reports of run folders and the figures in them.

Submodules are imported on use (plotly is slow to import): `report.html` writes the
page, `report.figures` builds the audit and routing figures, `report.export` writes
static images.
"""
