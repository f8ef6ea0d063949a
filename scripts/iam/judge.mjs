// Judges IAM requests with @cloud-copilot/iam-simulate: reads a JSON array of simulations
// (request, identityPolicies, resourcePolicy) on stdin and writes one line per simulation:
// its overall result (Allowed, ExplicitlyDenied, ImplicitlyDenied) or its validation errors.
import { runSimulation } from '@cloud-copilot/iam-simulate'

let input = ''
for await (const chunk of process.stdin) input += chunk
const results = []
for (const simulation of JSON.parse(input)) {
  const response = await runSimulation(
    {
      serviceControlPolicies: [],
      resourceControlPolicies: [],
      ...simulation,
    },
    {},
  )
  if (response.resultType === 'error') {
    results.push({ result: 'Error', errors: response.errors })
  } else {
    results.push({ result: response.overallResult })
  }
}
process.stdout.write(JSON.stringify(results) + '\n')
