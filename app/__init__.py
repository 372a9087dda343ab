"""rackplan: app — the Streamlit what-if UI (`rackplan ui`).

Pages live in app/views (thin Streamlit scripts, routed by app/main.py); what they compute lives
in plain modules tested without a browser: inputs (forms to specs), whatif (one simulation and
what it shows), searching (the planner's search and its tables), deploying (render, launch,
benchmark), charts (Plotly figures). app.cli adds `rackplan ui`; app.browser and
app.screenshots drive the running UI in Chromium. Nothing is imported here, so the CLI does not
pay for Streamlit or Plotly.
"""

__all__: list[str] = []
