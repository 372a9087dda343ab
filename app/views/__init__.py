"""The UI's pages, run by Streamlit as scripts (see app/main.py): what_if, search, deploy."""
