"""The rackplan UI: `rackplan ui` runs this script with Streamlit (`streamlit run app/main.py`).

Three pages: What-if (simulate one deployment), Search (find the best plans under SLOs) and
Deploy (render, launch and benchmark a plan). Icons are Streamlit's bundled Material Symbols
(served by the app itself, so they render offline and without emoji fonts).
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="rackplan", page_icon=":material/calculate:", layout="wide")
pages = [
    st.Page("views/what_if.py", title="What-if", icon=":material/tune:", default=True),
    st.Page("views/search.py", title="Search", icon=":material/search:"),
    st.Page("views/deploy.py", title="Deploy", icon=":material/rocket_launch:"),
]
st.navigation(pages).run()
