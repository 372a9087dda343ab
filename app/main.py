"""The rackplan UI: `rackplan ui` runs this script with Streamlit (`streamlit run app/main.py`).

Three pages: What-if (simulate one deployment), Search (find the best plans under SLOs) and
Deploy (render, launch and benchmark a plan).
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="rackplan", page_icon="🧮", layout="wide")
pages = [
    st.Page("views/what_if.py", title="What-if", icon="🔮", default=True),
    st.Page("views/search.py", title="Search", icon="🔎"),
    st.Page("views/deploy.py", title="Deploy", icon="🚀"),
]
st.navigation(pages).run()
