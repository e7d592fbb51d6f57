import textkit


def test_version():
    assert textkit.__version__ == "0.1.0"
