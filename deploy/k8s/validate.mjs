// Validates Kubernetes manifests offline: every document of every file given, built-in kinds
// against the Kubernetes OpenAPI schemas (npm kubernetes-models), Volcano Jobs against
// schemas/volcano-job.schema.json and their task templates as PodTemplateSpecs. Prints one
// line per document; exits 1 if any is invalid.
//   node validate.mjs FILE.yaml...   (dependencies: npm install in this folder)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import Ajv from "ajv";
import { validate as validatePodTemplate } from "kubernetes-models/_schemas/IoK8sApiCoreV1PodTemplateSpec";

const here = path.dirname(fileURLToPath(import.meta.url));
const groups = {
  "v1": await import("kubernetes-models/v1"),
  "apps/v1": await import("kubernetes-models/apps/v1"),
  "batch/v1": await import("kubernetes-models/batch/v1"),
};
const volcano = new Ajv({ allErrors: true }).compile(
  JSON.parse(fs.readFileSync(path.join(here, "schemas", "volcano-job.schema.json"), "utf8")));

function ajvText(errors) {
  return errors.map((e) => `${e.instancePath || "/"} ${e.message}` +
    (e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : "")).join("; ");
}

function check(doc) {
  const { apiVersion, kind } = doc;
  if (apiVersion === "batch.volcano.sh/v1alpha1" && kind === "Job") {
    if (!volcano(doc)) throw new Error(ajvText(volcano.errors));
    for (const [i, task] of doc.spec.tasks.entries()) {
      const errors = validatePodTemplate(task.template);
      if (errors && errors.length)
        throw new Error(`/spec/tasks/${i}/template: ` + ajvText(errors));
    }
    return;
  }
  const Model = groups[apiVersion] && groups[apiVersion][kind];
  if (!Model) throw new Error(`no schema for apiVersion ${apiVersion}, kind ${kind}`);
  new Model(doc).validate();
}

let bad = 0;
for (const file of process.argv.slice(2)) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  for (const d of docs) {
    const where = `${file}: ${d.get("kind")} ${d.getIn(["metadata", "name"])}`;
    if (d.errors.length) {
      console.log(`INVALID ${file}: YAML: ${d.errors[0].message}`);
      bad++;
      continue;
    }
    try {
      check(d.toJS());
      console.log(`ok      ${where}`);
    } catch (e) {
      console.log(`INVALID ${where}: ${e.message.split("\n").join(" ")}`);
      bad++;
    }
  }
}
process.exit(bad ? 1 : 0);
