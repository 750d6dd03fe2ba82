"""The converter pipeline's steps: one small class each, with a frozen typed input."""
