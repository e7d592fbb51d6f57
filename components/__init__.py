"""Pipeline stages. Each module is a plain typed function first and a KFP component second."""
