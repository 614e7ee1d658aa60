"""The paper at laptop scale: pre-train, release, zero-shot curves, Table 5 and Figure 2."""
