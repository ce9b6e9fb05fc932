// Generate.java - a prompt in, greedy text out, as `rebound run --temp 0` prints it.
//   java -cp rebound.jar -Djava.library.path=DIR Generate.java MODEL.gguf "PROMPT" [N]
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.rebound.*;

public class Generate {
    public static void main(String[] args) {
        if (args.length < 2) {
            System.err.println("usage: Generate MODEL.gguf PROMPT [N_TOKENS]");
            System.exit(2);
        }
        int n = args.length > 2 ? Integer.parseInt(args[2]) : 64;
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        try (Model model = new Model(args[0]); Session session = model.createSession()) {
            out.print(args[1]);
            session.generate(args[1], n, Sampler.greedy(), (token, piece) -> { out.print(piece); return true; });
        }
        out.flush();
    }
}
