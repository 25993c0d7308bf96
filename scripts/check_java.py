"""Fail early, with a fix, when Java 17+ (needed by PySpark) is missing."""

import re
import shutil
import subprocess
import sys

HELP = (
    "PySpark needs Java 17 or newer. Install it, e.g.\n"
    "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless\n"
    "  macOS:         brew install openjdk@17\n"
    "or point JAVA_HOME at an existing JDK 17+."
)


def main() -> int:
    java = shutil.which("java")
    if java is None:
        print("error: java not found on PATH.\n" + HELP, file=sys.stderr)
        return 1
    out = subprocess.run([java, "-version"], capture_output=True, text=True)
    text = out.stderr + out.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        print(f"error: cannot read the Java version from: {text!r}\n" + HELP, file=sys.stderr)
        return 1
    major = int(m.group(1))
    if major == 1 and m.group(2):
        major = int(m.group(2))
    if major < 17:
        print(f"error: Java {major} found at {java}, 17+ needed.\n" + HELP, file=sys.stderr)
        return 1
    print(f"java {major} ok ({java})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
