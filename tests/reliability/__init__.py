"""The hostile-user table: bad inputs run through the real CLI, each refused in one line."""
