package dev.contextsidecar.client;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.runner.Description;
import org.junit.runner.JUnitCore;
import org.junit.runner.Request;
import org.junit.runner.Result;
import org.junit.runner.notification.Failure;
import org.junit.runner.notification.RunListener;

/**
 * test.sh's runner: runs the JUnit 4 classes named on the command line (default: all of them) and
 * prints one line per test, which tests/test_java_client.py reads:
 *
 * <pre>
 * PASS RetryPolicyTest.backoffGrowsExponentiallyAndCaps 3ms
 * FAIL SidecarClientLiveTest.memoryAddAndSearch 41ms: expected ... (stack trace indented below)
 * SKIP SidecarClientLiveTest.memoryAddAndSearch: no live sidecar: pass -Dsidecar.addr=HOST:PORT
 * SUMMARY run=27 passed=26 failed=1 skipped=0
 * </pre>
 *
 * Exits 1 when a test failed or none ran, 0 otherwise (skips included: the caller decides).
 */
public final class TestMain {
  static final String[] ALL = {
    "RetryPolicyTest", "OfflineClientTest", "SidecarClientLiveTest", "AuthLiveTest",
  };

  private TestMain() {}

  public static void main(String[] args) throws ClassNotFoundException {
    List<Class<?>> classes = new ArrayList<>();
    for (String name : args.length > 0 ? args : ALL) {
      classes.add(Class.forName(name.contains(".") ? name : TestMain.class.getPackage().getName() + "." + name));
    }
    Map<String, String> outcome = new LinkedHashMap<>();
    Map<String, Long> started = new LinkedHashMap<>();
    JUnitCore core = new JUnitCore();
    core.addListener(new RunListener() {
      @Override
      public void testStarted(Description d) {
        started.put(name(d), System.nanoTime());
      }

      @Override
      public void testFailure(Failure f) {
        String msg = f.getMessage() == null ? f.getException().toString() : f.getMessage();
        outcome.put(name(f.getDescription()), "FAIL: " + oneLine(msg) + "\n" + indent(f.getTrace()));
      }

      @Override
      public void testAssumptionFailure(Failure f) {
        outcome.put(name(f.getDescription()), "SKIP: " + oneLine(String.valueOf(f.getMessage())));
      }

      @Override
      public void testIgnored(Description d) {
        System.out.println("SKIP " + name(d) + ": @Ignore");
        System.out.flush();
      }

      @Override
      public void testFinished(Description d) {
        String n = name(d);
        long ms = (System.nanoTime() - started.getOrDefault(n, System.nanoTime())) / 1_000_000;
        String o = outcome.getOrDefault(n, "PASS");
        if (o.startsWith("FAIL: ")) {
          int nl = o.indexOf('\n');
          System.out.println("FAIL " + n + " " + ms + "ms: " + o.substring(6, nl) + "\n" + o.substring(nl + 1));
        } else if (o.startsWith("SKIP: ")) {
          System.out.println("SKIP " + n + ": " + o.substring(6));
        } else {
          System.out.println("PASS " + n + " " + ms + "ms");
        }
        System.out.flush();
      }
    });
    Result r = core.run(Request.classes(classes.toArray(new Class<?>[0])));
    int failed = r.getFailureCount();
    int skipped = r.getAssumptionFailureCount() + r.getIgnoreCount();
    int passed = r.getRunCount() - failed - r.getAssumptionFailureCount();
    System.out.println("SUMMARY run=" + r.getRunCount() + " passed=" + passed + " failed=" + failed
        + " skipped=" + skipped);
    System.out.flush();
    System.exit(failed > 0 || r.getRunCount() == 0 ? 1 : 0);
  }

  private static String name(Description d) {
    String cls = d.getClassName();
    return cls.substring(cls.lastIndexOf('.') + 1) + "." + d.getMethodName();
  }

  private static String oneLine(String s) {
    return s.replace('\n', ' ').replace('\r', ' ');
  }

  private static String indent(String trace) {
    StringBuilder sb = new StringBuilder();
    for (String line : trace.split("\n")) {
      sb.append("    ").append(line).append('\n');
    }
    return sb.toString().replaceAll("\n$", "");
  }
}
