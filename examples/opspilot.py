"""The OpsPilot demo against a running sidecar: python examples/opspilot.py [--address HOST:PORT]"""
import sys

from sidecar.demo import main

raise SystemExit(main(sys.argv[1:]))
