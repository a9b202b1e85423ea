"""moelab: the `moelab` command; the parts live in reference/, sim/, gpu/ and app/."""
