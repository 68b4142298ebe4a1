"""Prints the loom command line (one argument per line, without the leading `loom`) of the
Job in a manifest, its $(VARIABLES) filled in and etcd pointed at a port nobody serves."""
import sys

import yaml

for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc["kind"] != "Job":
        continue
    spec = doc["spec"]
    tmpl = spec["template"] if "template" in spec else spec["tasks"][0]["template"]
    c = tmpl["spec"]["containers"][0]
    for a in c["command"][1:] + c["args"]:
        a = a.replace("$(JOB_NAME)", "k8s-test").replace("$(POD_IP)", "127.0.0.1")
        print(a.replace("etcd://loom-etcd:2379", "etcd://127.0.0.1:9"))
